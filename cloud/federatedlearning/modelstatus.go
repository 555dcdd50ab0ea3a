package federatedlearning

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// outputModelStatus is what the trainers' reports say of the job's output Model, as Sedna's GM writes it: the
// metrics of the first model (results[0]) of the latest report that has any, and when that report came. False
// when no report has metrics: the Model's status is then left as it is.
func outputModelStatus(reports []liveness.Report) (v1alpha1.ModelStatus, bool) {
	var latest *liveness.Report
	for i := range reports {
		r := &reports[i]
		if len(r.Results) == 0 || len(r.Results[0].Metrics) == 0 {
			continue
		}
		if latest == nil || r.At.After(latest.At) {
			latest = r
		}
	}
	if latest == nil {
		return v1alpha1.ModelStatus{}, false
	}
	var metrics []v1alpha1.Metric
	for k, v := range latest.Results[0].Metrics {
		metrics = append(metrics, v1alpha1.Metric{Key: k, Value: metricValue(v)})
	}
	sort.Slice(metrics, func(i, j int) bool { return metrics[i].Key < metrics[j].Key })
	at := metav1.NewTime(latest.At.Truncate(time.Second))
	return v1alpha1.ModelStatus{UpdateTime: &at, Metrics: v1alpha1.BoundMetrics(metrics)}, true
}

// metricValue shows a reported value as Sedna's GM does: a text as it is, anything else as its JSON.
func metricValue(v any) string {
	if s, isText := v.(string); isText {
		return s
	}
	text, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(text)
}

// syncModelStatus writes the output Model's status (the aggregation worker's Model) from the trainers' latest
// reports, when it says something new. It patches, so a Model shared by several jobs or edited meanwhile never
// makes the job's pass fail on a conflict; a Model that is gone is left alone.
func (r *Reconciler) syncModelStatus(ctx context.Context, job *v1alpha1.FederatedLearningJob) error {
	status, reported := outputModelStatus(r.Edge.Reports(Kind, job.Namespace, job.Name))
	if !reported {
		return nil
	}
	model := &v1alpha1.Model{}
	key := client.ObjectKey{Namespace: job.Namespace, Name: job.Spec.AggregationWorker.Model.Name}
	if err := r.Get(ctx, key, model); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading output model %s: %w", key.Name, err)
	}
	if equality.Semantic.DeepEqual(model.Status.Metrics, status.Metrics) {
		return nil
	}
	base := model.DeepCopy()
	model.Status = status
	if err := r.Status().Patch(ctx, model, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("writing the status of output model %s: %w", key.Name, err)
	}
	return nil
}
