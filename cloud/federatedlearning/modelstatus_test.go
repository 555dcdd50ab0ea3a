package federatedlearning

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

func TestOutputModelStatus(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 500, time.UTC)
	at := func(d time.Duration) *metav1.Time { m := metav1.NewTime(t0.Add(d).Truncate(time.Second)); return &m }
	result := func(metrics map[string]any) []lifelinev1.ReportResult {
		return []lifelinev1.ReportResult{{Format: "pb", URL: "/m/model.pb", Metrics: metrics}, {Format: "ckpt", Metrics: map[string]any{"other": 1.0}}}
	}
	for _, c := range []struct {
		name    string
		reports []liveness.Report
		want    *v1alpha1.ModelStatus
	}{
		{"no report", nil, nil},
		{"reports without metrics", []liveness.Report{{Worker: "t0", At: t0}, {Worker: "t1", At: t0, Results: result(nil)}}, nil},
		{"the latest report's first model, values as Sedna's GM shows them", []liveness.Report{
			{Worker: "t0", At: t0.Add(2 * time.Second), Results: result(map[string]any{"loss": 0.25, "accuracy": `[0.9,0.95]`, "best": true})},
			{Worker: "t1", At: t0, Results: result(map[string]any{"loss": 0.5})},
		}, &v1alpha1.ModelStatus{UpdateTime: at(2 * time.Second), Metrics: []v1alpha1.Metric{
			{Key: "accuracy", Value: "[0.9,0.95]"}, {Key: "best", Value: "true"}, {Key: "loss", Value: "0.25"}}}},
		{"a later report without metrics does not hide an earlier one's", []liveness.Report{
			{Worker: "t0", At: t0, Results: result(map[string]any{"loss": 0.5})},
			{Worker: "t1", At: t0.Add(time.Minute)},
		}, &v1alpha1.ModelStatus{UpdateTime: at(0), Metrics: []v1alpha1.Metric{{Key: "loss", Value: "0.5"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := outputModelStatus(c.reports)
			if c.want == nil {
				if ok {
					t.Errorf("status %+v from reports without metrics", got)
				}
				return
			}
			if diff := cmp.Diff(*c.want, got); !ok || diff != "" {
				t.Errorf("output model status (-want +got):\n%s", diff)
			}
		})
	}
}
