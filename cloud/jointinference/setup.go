package jointinference

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/coalesce"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// Cache indexes.
const (
	// modelIndex indexes services by the Models they name.
	modelIndex = "jointinference.models"
	// credentialIndex indexes Models by the Secret they name.
	credentialIndex = "model.credential"
	// nodeIndex indexes worker pods by the node they are bound to.
	nodeIndex = "jointinference.node"
	// workloadIndex indexes worker pods by their service's name label.
	workloadIndex = "jointinference.service"
)

// SetupWithManager registers the controller: it reconciles on changes of the service, of the children it owns,
// of their pods, and of the Models and Secrets the service depends on; and, edge-aware, on what the agents say
// and on the Ready condition of the nodes the workers are bound to, on which the agents' word depends.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	ctx := context.Background()
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &v1alpha1.JointInferenceService{}, modelIndex, func(o client.Object) []string {
		ji := o.(*v1alpha1.JointInferenceService)
		return []string{ji.Spec.EdgeWorker.Model.Name, ji.Spec.CloudWorker.Model.Name}
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &v1alpha1.Model{}, credentialIndex, func(o client.Object) []string {
		if name := o.(*v1alpha1.Model).Spec.CredentialName; name != "" {
			return []string{name}
		}
		return nil
	}); err != nil {
		return err
	}
	b, err := r.NewController(ctx, mgr, Kind, workloadIndex, nodeIndex, podToService)
	if err != nil {
		return err
	}
	return b.
		For(&v1alpha1.JointInferenceService{}).
		Named("jointinferenceservice").
		// A worker Deployment's status, and its pods, change in bursts as they roll out: their passes are folded; a
		// deleted Deployment is rebuilt at once.
		Watches(&appsv1.Deployment{}, coalesce.Changes(handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(),
			&v1alpha1.JointInferenceService{}, handler.OnlyControllerOwner()))).
		Owns(&corev1.Service{}).
		Owns(&autoscalingv2.HorizontalPodAutoscaler{}).
		Watches(&corev1.Pod{}, coalesce.Changes(handler.EnqueueRequestsFromMapFunc(podToService))).
		Watches(&v1alpha1.Model{}, handler.EnqueueRequestsFromMapFunc(r.modelToServices)).
		// Secrets as metadata only: the controller never holds a credential's keys.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.secretToServices), builder.OnlyMetadata).
		Complete(r)
}

// podToService maps a worker pod to its service by Sedna's name label.
func podToService(_ context.Context, o client.Object) []reconcile.Request {
	name, ok := o.GetLabels()[contract.LabelPrefix(Kind)+"name"]
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

func (r *Reconciler) modelToServices(ctx context.Context, o client.Object) []reconcile.Request {
	return r.servicesUsingModels(ctx, o.GetNamespace(), o.GetName())
}

func (r *Reconciler) secretToServices(ctx context.Context, o client.Object) []reconcile.Request {
	models := &v1alpha1.ModelList{}
	if err := r.List(ctx, models, client.InNamespace(o.GetNamespace()), client.MatchingFields{credentialIndex: o.GetName()}); err != nil {
		return nil
	}
	names := make([]string, 0, len(models.Items))
	for _, m := range models.Items {
		names = append(names, m.Name)
	}
	return r.servicesUsingModels(ctx, o.GetNamespace(), names...)
}

func (r *Reconciler) servicesUsingModels(ctx context.Context, namespace string, models ...string) []reconcile.Request {
	seen := map[string]bool{}
	var reqs []reconcile.Request
	for _, m := range models {
		list := &v1alpha1.JointInferenceServiceList{}
		if err := r.List(ctx, list, client.InNamespace(namespace), client.MatchingFields{modelIndex: m}); err != nil {
			continue
		}
		for _, ji := range list.Items {
			if !seen[ji.Name] {
				seen[ji.Name] = true
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&ji)})
			}
		}
	}
	return reqs
}
