package manager

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// identityEnv are the variables of a worker pod the controller reads: who the worker is, and of which workload
// and Dataset.
var identityEnv = []string{contract.EnvWorkerName, contract.EnvServiceName, contract.EnvJobName, contract.EnvDatasetName}

// cachedWorkerPod keeps of a worker pod what the controllers read, and drops the rest before it enters the
// cache: its metadata but who manages which field; its node and restart policy; its containers' names and
// identityEnv; its phase, reason, message and conditions; its containers' names, restarts and states. The cache
// holds every worker pod of the fleet, and they are the largest part of the controller's heap, where what is
// dropped (volumes, the other variables, images, tolerations, addresses) is most of a pod; the collector scans
// less and runs less often. No write of the controller's is made from a cached pod (it patches the fields it
// changes), so nothing dropped here is lost.
func cachedWorkerPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	pod.ManagedFields = nil
	containers := make([]corev1.Container, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		containers[i].Name = c.Name
		for _, e := range c.Env {
			if slices.Contains(identityEnv, e.Name) {
				containers[i].Env = append(containers[i].Env, e)
			}
		}
	}
	pod.Spec = corev1.PodSpec{NodeName: pod.Spec.NodeName, RestartPolicy: pod.Spec.RestartPolicy, Containers: containers}
	statuses := make([]corev1.ContainerStatus, len(pod.Status.ContainerStatuses))
	for i, c := range pod.Status.ContainerStatuses {
		statuses[i] = corev1.ContainerStatus{Name: c.Name, RestartCount: c.RestartCount, State: c.State}
	}
	pod.Status = corev1.PodStatus{Phase: pod.Status.Phase, Reason: pod.Status.Reason, Message: pod.Status.Message,
		Conditions: pod.Status.Conditions, ContainerStatuses: statuses}
	return pod, nil
}

// cachedNode keeps of a Node what the controller reads, its metadata (the edge role label) and its conditions
// (Ready, LifelineAgent), and drops the rest before it enters the cache, which holds every Node of the cluster: a
// kubelet's Node lists the images it holds, its addresses, capacity and system info, most of its size.
func cachedNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	node.ManagedFields = nil
	node.Spec = corev1.NodeSpec{}
	node.Status = corev1.NodeStatus{Conditions: node.Status.Conditions}
	return node, nil
}
