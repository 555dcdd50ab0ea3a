package federatedlearning

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/outcome"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// acted is what the act step did not manage, for the status to tell.
type acted struct {
	// stalledReason and stalledMessage say why the missing workers were not created: their inputs are missing,
	// or someone else's Service holds the aggregator's name.
	stalledReason, stalledMessage string
	err                           error // what could not be done to the children
	// serviceOnly: the pass created the aggregator's Service and left the rest to the next pass.
	serviceOnly bool
}

// act makes the children what the plan decided, asks the agents of cut-off nodes to heal the dead trainers they
// report, and writes the output Model's status from the trainers' reports; it returns what the agents' side and
// the Model failed at. Children that cannot be synced (done.err) do not stop the agents from healing.
func (r *Reconciler) act(ctx context.Context, job *v1alpha1.FederatedLearningJob, p *plan, workers []worker, now time.Time) (acted, error) {
	done := r.syncChildren(ctx, job, p)
	err := r.actThroughAgents(job, workers, now)
	if done.err == nil {
		err = errors.Join(err, r.syncModelStatus(ctx, job)) // modelstatus.go
	}
	return done, err
}

// actThroughAgents asks the agents of cut-off nodes to heal the dead trainers they report, and tells what the
// agents did; the job waits for such trainers meanwhile, as it waits for any trainer.
func (r *Reconciler) actThroughAgents(job *v1alpha1.FederatedLearningJob, workers []worker, now time.Time) error {
	views := map[string]liveness.View{}
	for _, w := range workers {
		if w.pod != nil {
			views[w.pod.Name] = w.view
		}
	}
	events, err := r.Edge.Act(podsOf(workers), views, now)
	for _, e := range events {
		r.Eventf(job, e.RelatedNode(), e.Type, e.Reason, e.Reason, "%s", e.Message)
	}
	return err
}

// syncChildren makes the children what the plan decided: the aggregator's Service, the missing workers, and the
// pods to delete or let go. A pass that creates the Service stops there, and the Service's creation, which the
// controller watches, brings the next pass: the workers dial the aggregator by the Service's name from their
// first second, and under load a Service's creation is the slowest request of a job's start (the API server
// allocates cluster IPs one at a time, each allocation a write of its own), so a pass that waited for it and
// then for the pods would hold a worker of the queue twice as long. Many jobs started at once thus get their
// Services first, as a client creating their children kind by kind would, and their pods after.
func (r *Reconciler) syncChildren(ctx context.Context, job *v1alpha1.FederatedLearningJob, p *plan) acted {
	var done acted
	var so serviceOutcome
	if !finished(p.status) {
		if so = r.ensureService(ctx, job); so.created != nil {
			r.EventCreated(job, ReasonSuccessfulCreate, []workload.CreatedChild{{Kind: "Service", Object: so.created}})
			done.serviceOnly = true
			return done
		}
	}
	var created []workload.CreatedChild
	done.stalledMessage, done.err = r.createWorkers(ctx, job, p, &created)
	if done.stalledMessage != "" {
		done.stalledReason = ReasonInputsNotFound
	}
	r.EventCreated(job, ReasonSuccessfulCreate, created)
	if !so.retryAt.IsZero() {
		p.retryAt = earliest(p.retryAt, so.retryAt)
	}
	if so.conflict != "" {
		done.stalledReason, done.stalledMessage = ReasonNameConflict, so.conflict
	}
	if done.err = errors.Join(so.err, done.err); done.err != nil {
		return done
	}
	if done.err = r.removePods(ctx, job, p.remove); done.err != nil {
		return done
	}
	if done.err = r.releasePods(ctx, p.release); done.err != nil {
		return done
	}
	done.err = r.markFinished(ctx, p.finish)
	return done
}

// markFinished marks the pods of a finished job that ended with WorkloadFinishedAnnotation.
func (r *Reconciler) markFinished(ctx context.Context, pods []*corev1.Pod) error {
	for _, pod := range pods {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": pod.UID, "annotations": map[string]string{lifelinev1.WorkloadFinishedAnnotation: "true"},
		}})
		if err != nil {
			return err
		}
		if err := r.Patch(ctx, pod.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("marking worker %s as its job's finished: %w", pod.Name, err)
		}
	}
	return nil
}

// createWorkers creates the missing workers decide chose, all at once as the Job controller creates a batch:
// a new job's workers cost one round trip to the API server, not one per worker. A name still taken in the API
// (the previous pod is not fully gone, or the cache is behind) is retried on the next pass: there is never more
// than one pod per identity. It returns what is missing of the workers' inputs, if anything is: they then wait
// for it. The workers it created are added to created.
func (r *Reconciler) createWorkers(ctx context.Context, job *v1alpha1.FederatedLearningJob, p *plan, created *[]workload.CreatedChild) (string, error) {
	if len(p.create) == 0 {
		return "", nil
	}
	in, missing := r.readInputs(ctx, job)
	if missing != "" {
		p.retryAt = time.Time{}
		return missing, nil
	}
	pods := make([]*corev1.Pod, 0, len(p.create))
	for _, id := range p.create {
		pod, err := renderWorker(in, id)
		if err != nil {
			return "", fmt.Errorf("rendering %s: %w", id.name, err)
		}
		pods = append(pods, pod)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // guards errs, created and p.retryAt
	var errs []error
	for _, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.Create(ctx, pod)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case apierrors.IsAlreadyExists(err):
				p.retryAt = earliest(p.retryAt, r.Clock().Add(time.Second))
			case err != nil:
				errs = append(errs, fmt.Errorf("creating worker %s: %w", pod.Name, err))
			default:
				log.FromContext(ctx).V(2).Info("created worker", "pod", pod.Name)
				*created = append(*created, workload.CreatedChild{Kind: "Pod", Object: pod})
			}
		}()
	}
	wg.Wait()
	return "", errors.Join(errs...)
}

// readInputs reads the Models and Datasets the job names, and the metadata of their Secrets; the message says
// what is missing.
func (r *Reconciler) readInputs(ctx context.Context, job *v1alpha1.FederatedLearningJob) (inputs, string) {
	in := inputs{job: job, secrets: map[string]*metav1.PartialObjectMetadata{}, lcServer: r.LCServer}
	get := func(name string, obj client.Object) string {
		if err := r.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: name}, obj); err != nil {
			kind := fmt.Sprintf("%T", obj)
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				kind = m.Kind
			}
			return fmt.Sprintf("%s %s: %v", kind, name, err)
		}
		return ""
	}
	in.model = &v1alpha1.Model{}
	if msg := get(job.Spec.AggregationWorker.Model.Name, in.model); msg != "" {
		return in, msg
	}
	credentials := []string{in.model.Spec.CredentialName}
	if pm := job.Spec.PretrainedModel; pm != nil && pm.Name != "" { // {name: ""} is none, as with Sedna
		in.pretrainedModel = &v1alpha1.Model{}
		if msg := get(pm.Name, in.pretrainedModel); msg != "" {
			return in, msg
		}
		credentials = append(credentials, in.pretrainedModel.Spec.CredentialName)
	}
	for _, tw := range job.Spec.TrainingWorkers {
		ds := &v1alpha1.Dataset{}
		if msg := get(tw.Dataset.Name, ds); msg != "" {
			return in, msg
		}
		in.datasets = append(in.datasets, ds)
		credentials = append(credentials, ds.Spec.CredentialName)
	}
	if t := job.Spec.Transmitter; t != nil && t.S3 != nil {
		credentials = append(credentials, t.S3.CredentialName)
	}
	for _, name := range credentials {
		if name == "" || in.secrets[name] != nil {
			continue
		}
		s := contract.SecretMetadata()
		if msg := get(name, s); msg != "" {
			return in, msg
		}
		in.secrets[name] = s
	}
	return in, ""
}

// serviceOutcome is what ensureService did and found, for the plan.
type serviceOutcome struct {
	retryAt  time.Time       // when to look again: a stale Service was removed
	created  *corev1.Service // the Service, when this pass created it
	conflict string          // a Service of someone else's holds the name
	err      error
}

// ensureService creates the aggregator's Service when it is missing. Its content depends only on the job's
// name and UID, which never change, so it is never updated.
func (r *Reconciler) ensureService(ctx context.Context, job *v1alpha1.FederatedLearningJob) serviceOutcome {
	want := renderAggregationService(job)
	got := &corev1.Service{}
	err := r.Get(ctx, client.ObjectKeyFromObject(want), got)
	switch {
	case apierrors.IsNotFound(err):
		created, err := outcome.Of(r.Create(ctx, want), apierrors.IsAlreadyExists)
		if err != nil {
			return serviceOutcome{err: fmt.Errorf("creating service %s: %w", want.Name, err)}
		}
		if created {
			return serviceOutcome{created: want}
		}
		return serviceOutcome{}
	case err != nil:
		return serviceOutcome{err: fmt.Errorf("reading service %s: %w", want.Name, err)}
	}
	owner := metav1.GetControllerOf(got)
	switch {
	case owner != nil && owner.UID == job.UID:
		return serviceOutcome{}
	case owner != nil && owner.Kind == Kind && owner.Name == job.Name:
		// Left by a deleted job of the same name; remove it and create ours on the next pass.
		uid := got.UID
		if err := r.Delete(ctx, got, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return serviceOutcome{err: fmt.Errorf("deleting stale service %s: %w", got.Name, err)}
		}
		return serviceOutcome{retryAt: r.Clock().Add(200 * time.Millisecond)}
	default:
		r.Eventf(job, got, corev1.EventTypeWarning, ReasonNameConflict, ReasonNameConflict, "Service %s exists and is not owned by this job", got.Name)
		return serviceOutcome{conflict: fmt.Sprintf("service %s exists and is not owned by this job", got.Name)}
	}
}

// removePods deletes pods by UID, so a replacement under the same name is never touched.
func (r *Reconciler) removePods(ctx context.Context, job *v1alpha1.FederatedLearningJob, pods []*corev1.Pod) error {
	for _, pod := range pods {
		uid := pod.UID
		// Gone already, or replaced under the same name (the UID precondition failed): nothing was deleted.
		deleted, err := outcome.Of(r.Delete(ctx, pod, client.Preconditions{UID: &uid}), apierrors.IsNotFound, apierrors.IsConflict)
		if err != nil {
			return fmt.Errorf("deleting worker %s: %w", pod.Name, err)
		}
		if deleted {
			r.Eventf(job, pod, corev1.EventTypeNormal, ReasonSuccessfulDelete, ReasonSuccessfulDelete, "Deleted pod %s", pod.Name)
		}
	}
	return nil
}

// releasePods removes Lifeline's finalizer, with a patch that fails if the pod was replaced meanwhile. The pods
// may be the cache's own: each patch answers into a copy.
func (r *Reconciler) releasePods(ctx context.Context, pods []*corev1.Pod) error {
	for _, pod := range pods {
		pod = pod.DeepCopy()
		var keep []string
		for _, f := range pod.Finalizers {
			if f != WorkerFinalizer {
				keep = append(keep, f)
			}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": pod.UID, "resourceVersion": pod.ResourceVersion, "finalizers": keep,
		}})
		if err != nil {
			return err
		}
		err = r.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch))
		if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("releasing worker %s: %w", pod.Name, err)
		}
	}
	return nil
}

// releaseOrphans lets go of the deleting pods of a job that is gone or being deleted, and of an earlier job of
// the same name.
func (r *Reconciler) releaseOrphans(ctx context.Context, key types.NamespacedName, job *v1alpha1.FederatedLearningJob) error {
	// Every pass asks, and almost always lets go of nothing: the cache's pods are read in place (releasePods
	// patches copies).
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingFields{workloadIndex: nameLabelValue(key.Name)},
		client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing pods of deleted job: %w", err)
	}
	var release []*corev1.Pod
	for i := range pods.Items {
		pod := &pods.Items[i]
		// Only pods already being deleted: a pod that still runs is never let go before its end is counted.
		live := job.UID != "" && job.DeletionTimestamp == nil && metav1.IsControlledBy(pod, job)
		if hasFinalizer(pod) && pod.DeletionTimestamp != nil && !live {
			release = append(release, pod)
		}
	}
	return r.releasePods(ctx, release)
}
