package federatedlearning

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

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

// writeStatus writes the status when it changed, failing on a concurrent change: decisions were made on the
// status read at the start of the pass, so a stale read must not overwrite a newer count. The whole status is
// sent (with the read's resourceVersion), so counters that stay 0 are written too.
func (r *Reconciler) writeStatus(ctx context.Context, job *v1alpha1.FederatedLearningJob, status v1alpha1.FederatedLearningJobStatus) error {
	if workload.Unchanged(status, job.Status) {
		return nil
	}
	updated := &v1alpha1.FederatedLearningJob{ObjectMeta: workload.StatusWriteMeta(job), Status: status}
	if err := r.StatusWriter().WriteStatus(ctx, updated); err != nil {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}
