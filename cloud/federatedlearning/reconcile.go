package federatedlearning

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// Reconciler runs FederatedLearningJobs like batch Jobs with named workers.
type Reconciler struct {
	workload.Deps
}

// Condition reasons and event reasons, stable for alerting. An Event of this controller names its action by its
// reason.
const (
	ReasonSuccessfulCreate     = workload.ReasonSuccessfulCreate
	ReasonSuccessfulDelete     = "SuccessfulDelete"
	ReasonWorkerFailed         = "WorkerFailed"
	ReasonWorkerDisrupted      = "WorkerDisrupted"
	ReasonBackoffLimitExceeded = "BackoffLimitExceeded"
	ReasonDeadlineExceeded     = "DeadlineExceeded"
	ReasonCompleted            = "Completed"
	ReasonWorkersRunning       = "WorkersRunning"
	ReasonWaitingForWorkers    = "WaitingForWorkers"
	ReasonNameConflict         = "NameConflict"
	ReasonInputsNotFound       = "InputsNotFound"
)

// Reconcile runs one level-triggered pass: observe the job's workers (observe.go), decide its children and status
// (decide.go), act (make the children what was decided, ask the agents of cut-off nodes to heal, write the output
// Model's status; act.go), and write status once (status.go).
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
	if done.serviceOnly {
		// The next pass, which the Service's creation brings, creates the workers and writes the status.
		return ctrl.Result{}, actErr
	}
	if err := r.writeStatus(ctx, job, r.statusAfter(job, p, done, now)); err != nil || actErr != nil {
		if actErr == nil && workload.Superseded(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, errors.Join(actErr, err)
	}
	for _, e := range p.events {
		r.Eventf(job, nil, e.eventType, e.reason, e.reason, "%s", e.note)
	}
	return r.afterFinish(ctx, job, p, now)
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
