package federatedlearning

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/coalesce"
)

// Cache indexes.
const (
	// nodeIndex indexes worker pods by the node they are bound to.
	nodeIndex = "federatedlearning.node"
	// workloadIndex indexes worker pods by their job's name label.
	workloadIndex = "federatedlearning.job"
	// modelIndex indexes jobs by the Models they name (the aggregation worker's and the pretrained one).
	modelIndex = "federatedlearning.models"
	// datasetIndex indexes jobs by the Datasets their training workers name.
	datasetIndex = "federatedlearning.datasets"
	// credentialIndex indexes jobs by the Secret of their transmitter, and Models and Datasets by the Secret
	// they name.
	credentialIndex = "federatedlearning.credential"
)

// SetupWithManager registers the controller: it reconciles on changes of the job, of the pods and Service it
// owns, and of the Models, Datasets and Secrets the job reads, so a job created before them starts when they
// appear; and, edge-aware, whenever an agent's word on one of its workers changes, and when the Ready condition
// of a node its workers are bound to changes, on which the agents' word depends.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	ctx := context.Background()
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &v1alpha1.FederatedLearningJob{}, modelIndex, func(o client.Object) []string {
		job := o.(*v1alpha1.FederatedLearningJob)
		names := []string{job.Spec.AggregationWorker.Model.Name}
		if pm := job.Spec.PretrainedModel; pm != nil && pm.Name != "" {
			names = append(names, pm.Name)
		}
		return names
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &v1alpha1.FederatedLearningJob{}, datasetIndex, func(o client.Object) []string {
		job := o.(*v1alpha1.FederatedLearningJob)
		names := make([]string, 0, len(job.Spec.TrainingWorkers))
		for _, tw := range job.Spec.TrainingWorkers {
			names = append(names, tw.Dataset.Name)
		}
		return names
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &v1alpha1.FederatedLearningJob{}, credentialIndex, func(o client.Object) []string {
		if t := o.(*v1alpha1.FederatedLearningJob).Spec.Transmitter; t != nil && t.S3 != nil && t.S3.CredentialName != "" {
			return []string{t.S3.CredentialName}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &v1alpha1.Model{}, credentialIndex, func(o client.Object) []string {
		return nonEmpty(o.(*v1alpha1.Model).Spec.CredentialName)
	}); err != nil {
		return err
	}
	if err := indexer.IndexField(ctx, &v1alpha1.Dataset{}, credentialIndex, func(o client.Object) []string {
		return nonEmpty(o.(*v1alpha1.Dataset).Spec.CredentialName)
	}); err != nil {
		return err
	}
	b, err := r.NewController(ctx, mgr, Kind, workloadIndex, nodeIndex, podToJob)
	if err != nil {
		return err
	}
	return b.
		For(&v1alpha1.FederatedLearningJob{}).
		Named("federatedlearningjob").
		// A job's pods change in bursts as they start and end: their passes are folded, their losses are not.
		Watches(&corev1.Pod{}, coalesce.Changes(handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(),
			&v1alpha1.FederatedLearningJob{}, handler.OnlyControllerOwner()))).
		Owns(&corev1.Service{}).
		Watches(&v1alpha1.Model{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.jobsUsing(ctx, o.GetNamespace(), modelIndex, o.GetName())
		})).
		Watches(&v1alpha1.Dataset{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.jobsUsing(ctx, o.GetNamespace(), datasetIndex, o.GetName())
		})).
		// Secrets as metadata only: the controller never holds a credential's keys.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.secretToJobs), builder.OnlyMetadata).
		Complete(r)
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// jobsUsing are the jobs of a namespace whose index holds one of names.
func (r *Reconciler) jobsUsing(ctx context.Context, namespace, index string, names ...string) []reconcile.Request {
	seen := map[string]bool{}
	var reqs []reconcile.Request
	for _, name := range names {
		jobs := &v1alpha1.FederatedLearningJobList{}
		if err := r.List(ctx, jobs, client.InNamespace(namespace), client.MatchingFields{index: name}); err != nil {
			continue
		}
		for _, job := range jobs.Items {
			if !seen[job.Name] {
				seen[job.Name] = true
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&job)})
			}
		}
	}
	return reqs
}

// secretToJobs maps a Secret to the jobs whose transmitter names it, or whose Models or Datasets do.
func (r *Reconciler) secretToJobs(ctx context.Context, o client.Object) []reconcile.Request {
	ns, name := o.GetNamespace(), o.GetName()
	reqs := r.jobsUsing(ctx, ns, credentialIndex, name)
	models := &v1alpha1.ModelList{}
	if err := r.List(ctx, models, client.InNamespace(ns), client.MatchingFields{credentialIndex: name}); err == nil {
		for _, m := range models.Items {
			reqs = append(reqs, r.jobsUsing(ctx, ns, modelIndex, m.Name)...)
		}
	}
	datasets := &v1alpha1.DatasetList{}
	if err := r.List(ctx, datasets, client.InNamespace(ns), client.MatchingFields{credentialIndex: name}); err == nil {
		for _, d := range datasets.Items {
			reqs = append(reqs, r.jobsUsing(ctx, ns, datasetIndex, d.Name)...)
		}
	}
	return reqs
}

// podToJob maps a worker pod to the job that controls it.
func podToJob(_ context.Context, o client.Object) []reconcile.Request {
	owner := metav1.GetControllerOf(o)
	if owner == nil || owner.Kind != Kind {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: owner.Name}}}
}
