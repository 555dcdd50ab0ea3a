package jointinference

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// statusAfter is the status the plan decided, with its Ready condition — false for a name conflict the act step
// found, which outranks what decide saw — and the metrics the workers reported. Ready is set here, once: set in
// decide and then replaced by a conflict, its transition time would move though the stored condition's status
// did not.
func (r *Reconciler) statusAfter(ji *v1alpha1.JointInferenceService, p plan, done syncOutcome, now time.Time) v1alpha1.JointInferenceServiceStatus {
	status, ready := p.status, p.ready
	if len(done.conflicts) > 0 {
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNameConflict
		ready.Message = "not owned by this service: " + strings.Join(done.conflicts, ", ")
	}
	conditions.Set(&status.Conditions, ready, metav1.NewTime(now))
	if metrics := edgeaware.ServiceMetrics(r.Edge.Reports(Kind, ji.Namespace, ji.Name)); metrics != nil {
		status.Metrics = v1alpha1.BoundMetrics(metrics)
	}
	return status
}

// writeStatus writes the status when it changed. It sends the status at the version the pass read, refused if a
// newer one exists (workload.Superseded): a pass that decided on a stale copy never overwrites what a later pass
// wrote.
func (r *Reconciler) writeStatus(ctx context.Context, ji *v1alpha1.JointInferenceService, status v1alpha1.JointInferenceServiceStatus) error {
	if workload.Unchanged(status, ji.Status) {
		return nil
	}
	updated := &v1alpha1.JointInferenceService{ObjectMeta: workload.StatusWriteMeta(ji), Status: status}
	if err := r.StatusWriter().WriteStatus(ctx, updated); err != nil {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}
