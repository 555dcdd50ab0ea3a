package contract

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IndexWorkloadPods is the function of a pod index by the workload of kind whose Sedna name label the pod
// carries, so a pass reads its own workload's pods without going through every pod of the namespace: at a
// thousand workloads a namespace holds thousands of pods, and a label-selected list walks them all.
// A mirror pod, the API server's copy of a node's static pod (an edge agent's stand-in for a worker, which carries
// the worker's labels), is no pod of the workload: the node runs it from its manifest, and its worker has its own.
func IndexWorkloadPods(kind string) client.IndexerFunc {
	label := LabelPrefix(kind) + "name"
	return func(o client.Object) []string {
		if IsMirrorPod(o) {
			return nil
		}
		if name, ok := o.GetLabels()[label]; ok {
			return []string{name}
		}
		return nil
	}
}

// MirrorAnnotation marks a mirror pod (Kubernetes' kubetypes.ConfigMirrorAnnotationKey).
const MirrorAnnotation = "kubernetes.io/config.mirror"

// IsMirrorPod tells whether o is a mirror pod: the API server's copy of a static pod, which its node runs.
func IsMirrorPod(o client.Object) bool {
	_, ok := o.GetAnnotations()[MirrorAnnotation]
	return ok
}
