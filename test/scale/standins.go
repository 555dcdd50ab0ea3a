package scale

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/edge/standin"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// standInArmer plays what arming costs the API server on every edge node, as the chart's default
// (agent.armStandIns) has it: the node's agent writes an armed stand-in for each of its workers, and the node (a
// kubelet or edged) makes the stand-in's mirror pod in the API server, controlled by the Node (so that no
// ReplicaSet whose selector its labels match adopts it), with the worker's labels. kwok then plays the stand-in
// as the nodes run it: Running at its gate, never Ready (kwok.go). When the worker's pod goes, the agent removes
// its stand-in and the node deletes the mirror pod.
//
// What is imitated is the mirror pod, not the agent's manifest: the worker's pod as the armed stand-in keeps it
// (its labels and annotations, its spec with each container's command behind the gate, no probes, no service
// account, the gate's readiness gate and volumes) under the names and marks a node and the agent give it.
type standInArmer struct {
	kube  kubernetes.Interface
	nodes map[string]types.UID // the Nodes that own the mirror pods

	queue chan armRequest
	wg    sync.WaitGroup

	mu    sync.Mutex
	armed map[types.NamespacedName]string // worker pod -> its stand-in's mirror pod

	created, deleted, failed atomic.Int64
	lastCreatedNano          atomic.Int64
	lastFailure              atomic.Value // the last failed request's error, as a string
}

// armRequest asks a node to create the mirror pod of a worker's armed stand-in (pod set), or to delete it.
type armRequest struct {
	mirror types.NamespacedName
	pod    *corev1.Pod
}

// armParallelism is how many mirror pods the nodes create or delete at once: one client stands for many
// kubelets, each of which makes its few requests as soon as its agent writes a stand-in.
const armParallelism = 32

func newStandInArmer(ctx context.Context, kube kubernetes.Interface, nodes map[string]types.UID) *standInArmer {
	a := &standInArmer{kube: kube, nodes: nodes, queue: make(chan armRequest, 1<<16), armed: map[types.NamespacedName]string{}}
	for range armParallelism {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case req := <-a.queue:
					a.apply(ctx, req)
				}
			}
		}()
	}
	return a
}

// observe arms a stand-in for each worker pod bound to an edge node, once, and removes it when the pod goes.
func (a *standInArmer) observe(pod *corev1.Pod, gone bool) {
	if _, worker := pod.Labels[contract.RoleLabel]; !worker || contract.IsMirrorPod(pod) || a.nodes[pod.Spec.NodeName] == "" {
		return
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	a.mu.Lock()
	mirror, armed := a.armed[key]
	leaving := gone || pod.DeletionTimestamp != nil
	switch {
	case leaving && armed:
		delete(a.armed, key)
		pod = nil
	case leaving || armed:
		a.mu.Unlock()
		return
	default:
		mirror = lifelinev1.StandInPodsOn(pod.Name, pod.Spec.NodeName)[0]
		a.armed[key] = mirror
	}
	a.mu.Unlock()
	a.queue <- armRequest{mirror: types.NamespacedName{Namespace: key.Namespace, Name: mirror}, pod: pod}
}

// apply creates or deletes a stand-in's mirror pod as the worker's node would.
func (a *standInArmer) apply(ctx context.Context, req armRequest) {
	pods := a.kube.CoreV1().Pods(req.mirror.Namespace)
	if req.pod == nil {
		a.count(pods.Delete(ctx, req.mirror.Name, metav1.DeleteOptions{}), &a.deleted)
		return
	}
	_, err := pods.Create(ctx, armedMirrorPod(req.pod, a.nodes[req.pod.Spec.NodeName], time.Now()), metav1.CreateOptions{})
	if err == nil {
		a.lastCreatedNano.Store(time.Now().UnixNano())
	}
	a.count(err, &a.created)
}

// lastCreated is when the last mirror pod was made.
func (a *standInArmer) lastCreated() time.Time { return time.Unix(0, a.lastCreatedNano.Load()) }

func (a *standInArmer) count(err error, done *atomic.Int64) {
	switch {
	case err == nil:
		done.Add(1)
	case apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err):
	default:
		a.failed.Add(1)
		a.lastFailure.Store(err.Error())
	}
}

// stop waits for the requests in flight; those queued are dropped.
func (a *standInArmer) stop() { a.wg.Wait() }

// gatesDir is where the chart's agent keeps its gates on the node (agent.stateDir), which the stand-ins mount.
const gatesDir = "/var/lib/lifeline-agent/gates"

// armedMirrorPod is the mirror pod a node makes of pod's armed stand-in, at seen.
func armedMirrorPod(pod *corev1.Pod, nodeUID types.UID, seen time.Time) *corev1.Pod {
	node := pod.Spec.NodeName
	staticName := lifelinev1.StandInPods(pod.Name)[0]
	sum := sha256.Sum256([]byte(pod.Namespace + "/" + pod.Name))
	gate := filepath.Join(gatesDir, "lifeline-"+hex.EncodeToString(sum[:12])+".json")
	binary := filepath.Join(gatesDir, ".bin", "lifeline-gate")
	hash := hex.EncodeToString(sum[12:28])

	labels := maps.Clone(pod.Labels)
	labels[lifelinev1.StandInLabel] = "true"
	annotations := maps.Clone(pod.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	maps.Copy(annotations, map[string]string{
		lifelinev1.StaticPodOfAnnotation: lifelinev1.StaticPodOf(pod.Namespace, pod.Name),
		standin.ArmedAnnotation:          gate,
		standin.WrittenAnnotation:        seen.UTC().Format(time.RFC3339Nano),
		"kubernetes.io/config.hash":      hash,
		"kubernetes.io/config.seen":      seen.UTC().Format(time.RFC3339Nano),
		"kubernetes.io/config.source":    "file",
		contract.MirrorAnnotation:        hash,
	})
	spec := *pod.Spec.DeepCopy()
	spec.ServiceAccountName, spec.DeprecatedServiceAccount = "", ""
	spec.AutomountServiceAccountToken = new(bool)
	tokens := dropTokenVolumes(&spec)
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	spec.ReadinessGates = append(spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: standin.GateCondition})
	directory, file := corev1.HostPathDirectory, corev1.HostPathFile
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: "lifeline-gate", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: gate, Type: &directory}}},
		corev1.Volume{Name: "lifeline-gate-binary", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: binary, Type: &file}}})
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.Command = append([]string{binary, "gate", "--path", filepath.Join(gate, "open"), "--"}, append(c.Command, c.Args...)...)
		c.Args, c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil, nil
		c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return tokens[m.Name] })
		c.VolumeMounts = append(c.VolumeMounts,
			corev1.VolumeMount{Name: "lifeline-gate", MountPath: gate, ReadOnly: true},
			corev1.VolumeMount{Name: "lifeline-gate-binary", MountPath: binary, ReadOnly: true})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: staticName + "-" + node, Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: nodeUID, Controller: ptr.To(true)}}},
		Spec: spec,
	}
}

// dropTokenVolumes removes the service account token volumes admission added to the worker, as the agent drops
// them from a stand-in (a node cannot fill them, and the API server refuses them in a mirror pod), and names them.
func dropTokenVolumes(spec *corev1.PodSpec) map[string]bool {
	tokens := map[string]bool{}
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool {
		if v.Projected == nil || !slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool { return p.ServiceAccountToken != nil }) {
			return false
		}
		tokens[v.Name] = true
		return true
	})
	return tokens
}

// String says what the nodes did.
func (a *standInArmer) String() string {
	s := fmt.Sprintf("%d stand-ins' mirror pods created, %d deleted, %d requests failed", a.created.Load(), a.deleted.Load(), a.failed.Load())
	if last, ok := a.lastFailure.Load().(string); ok {
		s += ", the last: " + last
	}
	return s
}

// podReady is the pod's Ready condition.
func podReady(p *corev1.Pod) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status
		}
	}
	return ""
}
