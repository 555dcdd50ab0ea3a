package jointinference

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// sednaTemplate tells whether a worker Deployment still runs the pod template Sedna's GM wrote: adopted as it
// runs (act.go), it keeps that template until the service next changes, and the pods its ReplicaSet makes
// from it lack Lifeline's role label.
func sednaTemplate(d *appsv1.Deployment) bool {
	if d == nil {
		return false
	}
	_, marked := d.Spec.Template.Labels[contract.RoleLabel]
	return !marked
}

// markSednaPods gives the pods of a worker Deployment still on Sedna's template Lifeline's role label, so they
// enter the controller's cache (which holds only pods so marked) and the edge agents' view at once, not after the
// next roll. Nothing else of them changes: the label is not in the Deployment's selector, so the ReplicaSet keeps
// them. The pods are read from the API server; what it returns, marked, is the worker's pods.
func (r *Reconciler) markSednaPods(ctx context.Context, ji *v1alpha1.JointInferenceService, workerType string) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.Uncached().List(ctx, pods, client.InNamespace(ji.Namespace),
		client.MatchingLabels(contract.Labels(Kind, ji.Name, ji.UID, workerType))); err != nil {
		return nil, fmt.Errorf("listing %s worker pods Sedna made: %w", workerType, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if _, marked := pod.Labels[contract.RoleLabel]; marked || pod.DeletionTimestamp != nil {
			continue
		}
		orig := pod.DeepCopy()
		pod.Labels[contract.RoleLabel] = workerType
		if err := r.Patch(ctx, pod, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("marking %s worker pod %s: %w", workerType, pod.Name, err)
		}
		log.FromContext(ctx).V(2).Info("marked worker pod Sedna made", "pod", pod.Name, "worker", workerType)
	}
	return pods.Items, nil
}
