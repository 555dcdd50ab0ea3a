package edgeaware

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// manyKeys is an ownerInfo of n numeric metrics.
func manyKeys(prefix string, n int) map[string]any {
	m := map[string]any{}
	for i := range n {
		m[fmt.Sprintf("%s%02d", prefix, i)] = float64(i)
	}
	return m
}

func TestServiceMetrics(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports []liveness.Report
		want    []v1alpha1.Metric
	}{
		{"no report", nil, nil},
		{"numbers summed over the edge workers, text kept, sorted by key", []liveness.Report{
			{Worker: "a", OwnerInfo: map[string]any{"inferenceNumber": 40.0, "hardExampleNumber": 12.0, "uploadCloudRatio": 0.3}},
			{Worker: "b", OwnerInfo: map[string]any{"inferenceNumber": 2.0, "model": "little.pb"}},
		}, []v1alpha1.Metric{{Key: "hardExampleNumber", Value: "12"}, {Key: "inferenceNumber", Value: "42"},
			{Key: "model", Value: "little.pb"}, {Key: "uploadCloudRatio", Value: "0.3"}}},
		{"a key numeric in one report wins over its text in another", []liveness.Report{
			{Worker: "a", OwnerInfo: map[string]any{"n": 1.0}}, {Worker: "b", OwnerInfo: map[string]any{"n": "many"}},
		}, []v1alpha1.Metric{{Key: "n", Value: "1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ServiceMetrics(tc.reports)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// Two workers' distinct keys, each within the table's bound, still make at most as many metrics.
	two := []liveness.Report{{OwnerInfo: manyKeys("a", liveness.MaxMetrics)}, {OwnerInfo: manyKeys("b", liveness.MaxMetrics)}}
	if got := len(ServiceMetrics(two)); got != liveness.MaxMetrics {
		t.Errorf("%d metrics, want %d", got, liveness.MaxMetrics)
	}
}

func TestTrainingProgress(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 9, 500, time.UTC)
	trainer := func(worker string, round float64, loss float64, reported time.Time) liveness.Report {
		return liveness.Report{Worker: worker, At: reported, OwnerInfo: map[string]any{"currentRound": round, "sampleCount": 30.0},
			Results: []lifelinev1.ReportResult{{Format: "pb", URL: "/model.pb", Metrics: map[string]any{"loss": loss}},
				{Format: "pb", URL: "/model-2.pb", Metrics: map[string]any{"loss": 9.0}}}}
	}
	for _, tc := range []struct {
		name    string
		reports []liveness.Report
		want    *v1alpha1.TrainingProgress
	}{
		{"no report", nil, nil},
		{"no round reported", []liveness.Report{{Worker: "t0", OwnerInfo: map[string]any{"currentRound": "two"}}}, nil},
		{"the highest round, its metrics averaged over its trainers, a model's first metric each",
			[]liveness.Report{trainer("t0", 2, 0.3, at.Add(-time.Second)), trainer("t1", 2, 0.1, at), trainer("t2", 1, 0.9, at)},
			&v1alpha1.TrainingProgress{Round: 2, LastReportTime: ptr.To(metav1.NewTime(at.Truncate(time.Second))),
				Metrics: []v1alpha1.Metric{{Key: "loss", Value: "0.2"}, {Key: "sampleCount", Value: "30"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, TrainingProgress(tc.reports)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
