package federatedlearning

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// Reconciler runs FederatedLearningJobs like batch Jobs with named workers.
type Reconciler struct {
	workload.Deps
}

// Reconcile runs one level-triggered pass: observe the job's workers, decide (decide.go), act (make the children
// what was decided, ask the agents of cut-off nodes to heal, write the output Model's status), and write status once.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &v1alpha1.FederatedLearningJob{}
	// The cache's job, not a copy: a pass only reads it, and writes its status from a copy (writeStatus).
	err := r.Get(ctx, req.NamespacedName, job, client.UnsafeDisableDeepCopy)
	if client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	// Pods being deleted by the garbage collector — of this job if it is going, or of an earlier job of the same
	// name — are let go, or they would hold their deletion, and their names, forever.
	if err := r.releaseOrphans(ctx, req.NamespacedName, job); err != nil {
		return ctrl.Result{}, err
	}
	if apierrors.IsNotFound(err) || job.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}

	workers, err := r.observe(ctx, job)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.Clock()
	p := decide(job, workers, effectivePolicy(job), now)
	done, actErr := r.act(ctx, job, &p, workers, now)
	if done.err != nil {
		// What was synced is partial: the status would describe a pass that did not happen.
		return ctrl.Result{}, errors.Join(done.err, actErr)
	}
	if err := r.writeStatus(ctx, job, r.statusAfter(job, p, done, now)); err != nil || actErr != nil {
		if actErr == nil && workload.Superseded(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, errors.Join(actErr, err)
	}
	for _, e := range p.events {
		r.event(job, nil, e.eventType, e.reason, "%s", e.note)
	}
	return r.afterFinish(ctx, job, p, now)
}

// acted is what the act step did not manage, for the status to tell.
type acted struct {
	// stalledReason and stalledMessage say why the missing workers were not created: their inputs are missing,
	// or someone else's Service holds the aggregator's name.
	stalledReason, stalledMessage string
	err                           error // what could not be done to the children
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

// statusAfter is the status the plan decided, with what the act step could not do and the trainers' progress.
func (r *Reconciler) statusAfter(job *v1alpha1.FederatedLearningJob, p plan, done acted, now time.Time) v1alpha1.FederatedLearningJobStatus {
	status := p.status
	if done.stalledReason != "" {
		conditions.Set(&status.Conditions, metav1.Condition{Type: v1alpha1.FLConditionTraining, Status: metav1.ConditionFalse,
			Reason: done.stalledReason, Message: done.stalledMessage, ObservedGeneration: job.Generation}, metav1.NewTime(now))
	}
	if progress := edgeaware.TrainingProgress(r.Edge.Reports(Kind, job.Namespace, job.Name)); progress != nil {
		progress.Metrics = v1alpha1.BoundMetrics(progress.Metrics)
		status.Progress = progress
	}
	return status
}

// observe pairs each identity with its pod in the cache: the pod of its stable name, or else a pod Sedna's GM
// made that was adopted for it (adopt.go). Pods of an earlier job of the same name (another UID) are not this
// job's. Before the first status of a job that is still running, the pods GM made are looked for and adopted,
// so none of its workers is created twice.
func (r *Reconciler) observe(ctx context.Context, job *v1alpha1.FederatedLearningJob) ([]worker, error) {
	pods := &corev1.PodList{}
	// The cache's pods, not copies: a pass only reads them, but for releasePods, which patches a copy.
	if err := r.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingFields{workloadIndex: nameLabelValue(job.Name)},
		client.MatchingLabels(selectorLabels(job)), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing worker pods: %w", err)
	}
	ids := identities(job)
	byName := map[string]*corev1.Pod{}
	isID := make(map[string]bool, len(ids))
	for _, id := range ids {
		isID[id.name] = true
	}
	var others []*corev1.Pod
	for i := range pods.Items {
		pod := &pods.Items[i]
		switch {
		case !metav1.IsControlledBy(pod, job):
		case isID[pod.Name]:
			byName[pod.Name] = pod
		default:
			others = append(others, pod)
		}
	}
	for _, pod := range others {
		if name := identityOf(job, pod); name != "" && byName[name] == nil {
			byName[name] = pod
		}
	}
	if len(job.Status.Workers) == 0 && !finished(job.Status) {
		free := map[string]bool{}
		for _, id := range ids {
			free[id.name] = byName[id.name] == nil
		}
		adopted, err := r.adoptSednaPods(ctx, job, free)
		if err != nil {
			return nil, err
		}
		for name, pod := range adopted {
			byName[name] = pod
		}
	}
	records := map[string]v1alpha1.WorkerStatus{}
	for _, w := range job.Status.Workers {
		records[w.Name] = w
	}
	workers := make([]worker, 0, len(ids))
	for _, id := range ids {
		workers = append(workers, worker{id: id, pod: byName[id.name], record: records[id.name]})
	}
	views := r.Edge.Views(ctx, podsOf(workers), r.Clock())
	for i := range workers {
		if workers[i].pod != nil {
			workers[i].view = views[workers[i].pod.Name]
		}
	}
	return workers, nil
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
		r.event(job, e.RelatedNode(), e.Type, e.Reason, "%s", e.Message)
	}
	return err
}

func podsOf(workers []worker) []*corev1.Pod {
	pods := make([]*corev1.Pod, 0, len(workers))
	for _, w := range workers {
		if w.pod != nil {
			pods = append(pods, w.pod)
		}
	}
	return pods
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

// writeStatus writes the status when it changed, failing on a concurrent change: decisions were made on the
// status read at the start of the pass, so a stale read must not overwrite a newer count. The whole status is
// sent (with the read's resourceVersion), so counters that stay 0 are written too.
func (r *Reconciler) writeStatus(ctx context.Context, job *v1alpha1.FederatedLearningJob, status v1alpha1.FederatedLearningJobStatus) error {
	if workload.Unchanged(status, job.Status) {
		return nil
	}
	updated := &v1alpha1.FederatedLearningJob{ObjectMeta: workload.StatusWriteMeta(job), Status: status}
	if err := r.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

// afterFinish deletes a finished job once its TTL has passed, and schedules the next pass.
func (r *Reconciler) afterFinish(ctx context.Context, job *v1alpha1.FederatedLearningJob, p plan, now time.Time) (ctrl.Result, error) {
	pol := effectivePolicy(job)
	if finished(p.status) && pol.ttlAfterFinished != nil {
		expires := finishTime(p.status).Add(*pol.ttlAfterFinished)
		if !now.Before(expires) {
			uid := job.UID
			err := r.Delete(ctx, job, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
			if client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, fmt.Errorf("deleting job after its TTL: %w", err)
			}
			return ctrl.Result{}, nil
		}
		p.retryAt = earliest(p.retryAt, expires)
	}
	if p.retryAt.IsZero() {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: max(p.retryAt.Sub(now), 10*time.Millisecond)}, nil
}

// finishTime is when the job's terminal condition was set.
func finishTime(s v1alpha1.FederatedLearningJobStatus) time.Time {
	for _, t := range []string{v1alpha1.FLConditionComplete, v1alpha1.FLConditionFailed} {
		if c := findCondition(s.Conditions, t); c != nil && c.Status == metav1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

func (r *Reconciler) event(job *v1alpha1.FederatedLearningJob, related client.Object, eventType, reason, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(job, related, eventType, reason, reason, note, args...)
	}
}
