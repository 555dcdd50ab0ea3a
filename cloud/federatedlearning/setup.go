package federatedlearning

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract/nodewatch"
)

// nodeIndex indexes worker pods by the node they are bound to.
const nodeIndex = "federatedlearning.node"

// SetupWithManager registers the controller: it reconciles on changes of the job and of the pods and Service
// it owns; and, edge-aware, whenever an agent's word on one of its workers changes, and when the Ready condition
// of a node its workers are bound to changes, on which the agents' word depends.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr)
	if edge := r.Edge.Source(mgr.GetClient(), podToJob, Kind); edge != nil {
		var err error
		if b, err = nodewatch.Watch(context.Background(), mgr, b.WatchesRawSource(edge), nodeIndex, podToJob); err != nil {
			return err
		}
	}
	return b.
		For(&v1alpha1.FederatedLearningJob{}).
		Named("federatedlearningjob").
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		Complete(r)
}

// podToJob maps a worker pod to the job that controls it.
func podToJob(_ context.Context, o client.Object) []reconcile.Request {
	owner := metav1.GetControllerOf(o)
	if owner == nil || owner.Kind != Kind {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: owner.Name}}}
}
