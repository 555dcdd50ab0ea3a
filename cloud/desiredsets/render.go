// Package desiredsets sends each edge node's agent the controller's word on the node's workers: a DesiredWorkers
// set, with each worker's stand-in manifest as the API server has its pod [P-DES-1]. An agent rebuilds a worker
// the node lost while cut off from that word alone, which it holds over its authenticated session with the
// broker: a process of the node that answers at KubeEdge's MetaServer address never chooses what it writes.
package desiredsets

import (
	"cmp"
	"encoding/json"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// renderSet is the set of node's workers among pods (those bound to it that carry the role label, neither mirror
// pods nor stand-ins), sorted by namespace and name, within the protocol's bounds [P-DES-3]; BirthSeq and Revision
// are left to the sender.
func renderSet(node string, pods []corev1.Pod) *lifelinev1.DesiredWorkers {
	set := &lifelinev1.DesiredWorkers{Node: node}
	var workers []*corev1.Pod
	for i := range pods {
		if isWorkerOf(node, &pods[i]) {
			workers = append(workers, &pods[i])
		}
	}
	slices.SortFunc(workers, func(a, b *corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if len(workers) > lifelinev1.MaxWorkers {
		set.Dropped = uint32(len(workers) - lifelinev1.MaxWorkers)
		workers = workers[:lifelinev1.MaxWorkers]
	}
	for _, pod := range workers {
		set.Workers = append(set.Workers, &lifelinev1.DesiredWorker{PodUid: string(pod.UID), Manifest: staticManifest(pod),
			Started: started(pod)})
	}
	boundManifests(set.Workers, workers)
	set.Dropped += boundPayload(set)
	return set
}

// isWorkerOf tells whether pod is one of node's workers: bound to it, with the role label, neither the API
// server's copy of a static pod nor one of the agent's stand-ins, which the node runs from its own directory, nor
// one that ended in a workload that finished [P-DES-4].
func isWorkerOf(node string, pod *corev1.Pod) bool {
	_, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]
	_, standIn := pod.Annotations[lifelinev1.StaticPodOfAnnotation]
	_, finished := pod.Annotations[lifelinev1.WorkloadFinishedAnnotation]
	_, worker := pod.Labels[lifelinev1.RoleLabel]
	return pod.Spec.NodeName == node && worker && !mirror && !standIn && !finished
}

// staticPod is the shape of a static-pod manifest: what a static pod of a worker keeps of its pod.
type staticPod struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   staticMetadata `json:"metadata"`
	Spec       corev1.PodSpec `json:"spec"`
}

type staticMetadata struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// staticManifest is pod as a static pod of it: its name, namespace, labels, annotations and spec, without the node
// it is bound to.
func staticManifest(pod *corev1.Pod) []byte {
	spec := *pod.Spec.DeepCopy()
	spec.NodeName = ""
	return mustJSON(staticPod{APIVersion: "v1", Kind: "Pod", Spec: spec,
		Metadata: staticMetadata{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels, Annotations: pod.Annotations}})
}

// marksManifest is what the agent reads of pod when its manifest is left out: its role label, Lifeline's
// annotations, its restart policy and its containers' WORKER_NAME, each within MaxMarkBytes.
func marksManifest(pod *corev1.Pod) []byte {
	keep := func(in map[string]string, take func(string) bool) map[string]string {
		out := map[string]string{}
		for k, v := range in {
			if take(k) && len(v) <= lifelinev1.MaxMarkBytes {
				out[k] = v
			}
		}
		return out
	}
	spec := corev1.PodSpec{RestartPolicy: pod.Spec.RestartPolicy}
	for _, c := range pod.Spec.Containers {
		kept := corev1.Container{Name: c.Name}
		for _, e := range c.Env {
			if e.Name == workerNameEnv && e.ValueFrom == nil && len(e.Value) <= lifelinev1.MaxMarkBytes {
				kept.Env = append(kept.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
			}
		}
		spec.Containers = append(spec.Containers, kept)
	}
	return mustJSON(staticPod{APIVersion: "v1", Kind: "Pod", Spec: spec, Metadata: staticMetadata{Name: pod.Name, Namespace: pod.Namespace,
		Labels:      keep(pod.Labels, func(k string) bool { return k == lifelinev1.RoleLabel }),
		Annotations: keep(pod.Annotations, func(k string) bool { return strings.HasPrefix(k, lifelinev1.MarkPrefix) })}})
}

// workerNameEnv names a worker in its Sedna reports.
const workerNameEnv = "WORKER_NAME"

// boundManifests leaves out, for its marks alone, every manifest beyond MaxManifestBytes, then the largest ones
// until those kept are within MaxDesiredBytes together.
func boundManifests(out []*lifelinev1.DesiredWorker, pods []*corev1.Pod) {
	total := 0
	for i, w := range out {
		if len(w.Manifest) > lifelinev1.MaxManifestBytes {
			leaveOutManifest(w, pods[i])
		}
		total += len(w.Manifest)
	}
	bySize := make([]int, len(out))
	for i := range bySize {
		bySize[i] = i
	}
	slices.SortStableFunc(bySize, func(a, b int) int { return cmp.Compare(len(out[b].Manifest), len(out[a].Manifest)) })
	for _, i := range bySize {
		if total <= lifelinev1.MaxDesiredBytes {
			return
		}
		if out[i].ManifestBytes == 0 {
			total -= len(out[i].Manifest)
			leaveOutManifest(out[i], pods[i])
			total += len(out[i].Manifest)
		}
	}
}

func leaveOutManifest(w *lifelinev1.DesiredWorker, pod *corev1.Pod) {
	w.ManifestBytes, w.Manifest = uint32(len(w.Manifest)), marksManifest(pod)
}

// boundPayload leaves out the workers with the largest manifests (whole or marks) until the set is within
// MaxDesiredPayloadBytes, and returns how many it left out.
func boundPayload(set *lifelinev1.DesiredWorkers) uint32 {
	var dropped uint32
	for proto.Size(set) > lifelinev1.MaxDesiredPayloadBytes {
		largest := 0
		for i, w := range set.Workers {
			if len(w.Manifest) > len(set.Workers[largest].Manifest) {
				largest = i
			}
		}
		set.Workers = slices.Delete(set.Workers, largest, largest+1)
		dropped++
	}
	return dropped
}

func mustJSON(v any) []byte {
	out, err := json.Marshal(v)
	if err != nil {
		panic(err) // a PodSpec and string maps always marshal
	}
	return out
}
