package desiredsets

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// APINodePods lists a node's worker pods from the API server (a reader that does not go through the cache).
type APINodePods struct {
	Reader client.Reader
	// Namespaces are those the controller manages (all when empty), as its cache.
	Namespaces []string
}

// NodeWorkers lists the worker pods (those with the role label) bound to node.
func (p APINodePods) NodeWorkers(ctx context.Context, node string) ([]corev1.Pod, error) {
	workers, err := labels.Parse(lifelinev1.RoleLabel)
	if err != nil {
		return nil, err
	}
	namespaces := p.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var out []corev1.Pod
	for _, ns := range namespaces {
		var list corev1.PodList
		if err := p.Reader.List(ctx, &list, &client.ListOptions{Namespace: ns, LabelSelector: workers,
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

// PodEvents is the handler of the worker pods' informer that enqueues a node whose set a pod's change may change:
// a worker bound, deleted, its spec, labels or annotations changed, or its start [P-DES-1]. A status change alone
// changes no set, nor does any change of a mirror pod or a stand-in.
func (s *Sender) PodEvents() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok && isWorkerOf(pod.Spec.NodeName, pod) {
				s.enqueuePodChange(pod.Spec.NodeName)
			}
		},
		UpdateFunc: func(before, after any) {
			old, okOld := before.(*corev1.Pod)
			pod, ok := after.(*corev1.Pod)
			if ok && okOld && (isWorkerOf(old.Spec.NodeName, old) || isWorkerOf(pod.Spec.NodeName, pod)) && changesSet(old, pod) {
				s.enqueuePodChange(old.Spec.NodeName)
				s.enqueuePodChange(pod.Spec.NodeName)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok && isWorkerOf(pod.Spec.NodeName, pod) {
				s.enqueuePodChange(pod.Spec.NodeName)
			}
		},
	}
}

// changesSet tells whether a pod's update may change its node's set: what renderSet reads of it but the status.
func changesSet(old, pod *corev1.Pod) bool {
	return old.Spec.NodeName != pod.Spec.NodeName || old.UID != pod.UID || old.Generation != pod.Generation ||
		started(old) != started(pod) || !maps.Equal(old.Labels, pod.Labels) || !maps.Equal(old.Annotations, pod.Annotations)
}

// started: the pod's phase says its node ran it.
func started(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodFailed
}
