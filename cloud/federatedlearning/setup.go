package federatedlearning

import (
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// SetupWithManager registers the controller: it reconciles on changes of the job and of the pods and Service
// it owns.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.FederatedLearningJob{}).
		Named("federatedlearningjob").
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		Complete(r)
}
