package jointinference

import (
	"context"
	"errors"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// Reconciler keeps each JointInferenceService's children equal to what its spec renders to.
type Reconciler struct {
	workload.Deps
}

// Event reasons, stable for alerting.
const (
	ReasonSuccessfulCreate = workload.ReasonSuccessfulCreate
	ReasonSuccessfulUpdate = "SuccessfulUpdate"
	ReasonSuccessfulDelete = "SuccessfulDelete"
	ReasonAdopted          = "Adopted"
	ReasonNameConflict     = "NameConflict"
	ReasonModelNotFound    = "ModelNotFound"
	ReasonSecretNotFound   = "SecretNotFound"
	ReasonInvalidSpec      = "InvalidSpec"
)

// ConditionReady is true when both workers are available at the service's current generation.
const ConditionReady = "Ready"

// Reasons of the Ready condition besides the event reasons.
const (
	ReasonWorkersAvailable    = "WorkersAvailable"
	ReasonWorkersNotAvailable = "WorkersNotAvailable"
)

// staleRequeue is how soon a reconcile runs again after it removed a child left by an earlier service of the
// same name, so the child's deletion has reached the cache.
const staleRequeue = 200 * time.Millisecond

// Reconcile runs one level-triggered pass: observe the service's inputs and workers (observe.go), decide its
// children and status (decide.go), act (make the cluster match, then ask the agents of cut-off nodes to heal;
// act.go), and write status once (status.go).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ji := &v1alpha1.JointInferenceService{}
	// The cache's service, not a copy: a pass only reads it, and writes its status from a copy (writeStatus).
	if err := r.Get(ctx, req.NamespacedName, ji, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ji.DeletionTimestamp != nil {
		// The garbage collector removes the children; creating any now would race it.
		return ctrl.Result{}, nil
	}

	obs, err := r.observe(ctx, ji)
	if err != nil {
		return ctrl.Result{}, err
	}
	p := decide(obs)
	done, actErr := r.act(ctx, ji, p, obs)
	if done.err != nil {
		// What was synced is partial: the status would describe a pass that did not happen.
		return ctrl.Result{}, errors.Join(done.err, actErr)
	}
	if done.serviceOnly {
		// The next pass, which the Service's creation brings, syncs the rest and writes the status.
		return ctrl.Result{}, actErr
	}
	if err := r.writeStatus(ctx, ji, r.statusAfter(ji, p, done, obs.now)); err != nil || actErr != nil {
		if actErr == nil && workload.Superseded(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, errors.Join(actErr, err)
	}
	if done.removedStale {
		return ctrl.Result{RequeueAfter: staleRequeue}, nil
	}
	return ctrl.Result{}, nil
}
