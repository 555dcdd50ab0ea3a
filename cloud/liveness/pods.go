package liveness

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// PodInfo is what the API server says of a worker pod, as much as the tracker needs to check what a node says of
// it [P-AUTH-3].
type PodInfo struct {
	// Node is the node the pod is bound to; "" while it is not scheduled.
	Node string
	UID  string
	// Worker is the pod's WORKER_NAME, the name its Sedna reports carry: the pod's own name for FL workers, the
	// Deployment's for JI workers.
	Worker string
	// OwnerKind and OwnerName name the Sedna workload the pod works for ("JointInferenceService" or
	// "FederatedLearningJob"); empty for a pod of neither.
	OwnerKind, OwnerName string
}

// Pods is the tracker's window on the API server's worker pods (the manager's cache).
type Pods interface {
	// Pod returns what the cache has of the pod namespace/name; false when it has no such pod.
	Pod(namespace, name string) (PodInfo, bool)
	// Workers returns the pods in namespace whose WORKER_NAME is worker.
	Workers(namespace, worker string) []PodInfo
}

// ownerNameEnv is, per workload kind, the variable that names the workload in its pods: what Sedna's worker
// library reports as ownerName.
var ownerNameEnv = map[string]string{"JointInferenceService": contract.EnvServiceName, "FederatedLearningJob": contract.EnvJobName}

// PodInfoOf reads a worker pod as the tracker checks it: its node and UID, its WORKER_NAME, and its workload (the
// kind from its Sedna name label, <kind>.sedna.io/name, the name from the variable the worker reports it by).
func PodInfoOf(pod *corev1.Pod) PodInfo {
	info := PodInfo{Node: pod.Spec.NodeName, UID: string(pod.UID), Worker: envOf(pod, contract.EnvWorkerName)}
	for _, kind := range ownerKinds {
		if _, labelled := pod.Labels[contract.LabelPrefix(kind)+"name"]; labelled {
			info.OwnerKind, info.OwnerName = kind, envOf(pod, ownerNameEnv[kind])
		}
	}
	return info
}

// envOf is the value of a plain variable of the pod's first container that sets it, or "".
func envOf(pod *corev1.Pod, name string) string {
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name && e.ValueFrom == nil {
				return e.Value
			}
		}
	}
	return ""
}

// WorkerNameIndex is the field index of pods by WORKER_NAME that CachePods.Workers reads; register it with
// IndexWorkerName before the cache starts.
const WorkerNameIndex = "lifeline.sedna.io/worker-name"

// IndexWorkerName is the indexer of WorkerNameIndex.
func IndexWorkerName(o client.Object) []string {
	pod, ok := o.(*corev1.Pod)
	if !ok || contract.IsMirrorPod(pod) { // a stand-in's mirror: the worker's pod is its own
		return nil
	}
	if w := envOf(pod, contract.EnvWorkerName); w != "" {
		return []string{w}
	}
	return nil
}

// CachePods reads worker pods from a cache that has WorkerNameIndex.
type CachePods struct {
	Reader client.Reader
}

// Pod implements Pods.
func (c CachePods) Pod(namespace, name string) (PodInfo, bool) {
	pod := &corev1.Pod{}
	if err := c.Reader.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
		return PodInfo{}, false
	}
	return PodInfoOf(pod), true
}

// Workers implements Pods.
func (c CachePods) Workers(namespace, worker string) []PodInfo {
	pods := &corev1.PodList{}
	if err := c.Reader.List(context.Background(), pods, client.InNamespace(namespace), client.MatchingFields{WorkerNameIndex: worker}); err != nil {
		return nil
	}
	out := make([]PodInfo, 0, len(pods.Items))
	for i := range pods.Items {
		out = append(out, PodInfoOf(&pods.Items[i]))
	}
	return out
}
