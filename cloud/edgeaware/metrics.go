package edgeaware

import (
	"fmt"
	"math"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// ServiceMetrics turns the JI edge workers' latest reports into the service's status.metrics (Sedna's
// inferenceNumber, hardExampleNumber, uploadCloudRatio, ... as reported), summed over workers for numbers; nil
// when no worker reported.
func ServiceMetrics(reports []liveness.Report) []v1alpha1.Metric {
	if len(reports) == 0 {
		return nil
	}
	sums, texts := map[string]float64{}, map[string]string{}
	for _, r := range reports {
		for k, v := range r.OwnerInfo {
			if f, ok := v.(float64); ok {
				sums[k] += f
			} else {
				texts[k] = fmt.Sprint(v)
			}
		}
	}
	var out []v1alpha1.Metric
	for k, v := range sums {
		out = append(out, v1alpha1.Metric{Key: k, Value: formatNumber(v)})
	}
	for k, v := range texts {
		if _, isNumber := sums[k]; !isNumber {
			out = append(out, v1alpha1.Metric{Key: k, Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out[:min(len(out), liveness.MaxMetrics)]
}

// TrainingProgress turns the trainers' latest reports into the job's progress: the highest round a trainer
// reported (Sedna's ownerInfo.currentRound), that round's numeric metrics — the models' metrics and the
// sampleCount — averaged over the trainers that reported it, and when the latest report came; nil when no
// trainer reported a round.
func TrainingProgress(reports []liveness.Report) *v1alpha1.TrainingProgress {
	var p *v1alpha1.TrainingProgress
	var latest time.Time
	rounds := map[int32][]liveness.Report{}
	for _, r := range reports {
		if r.At.After(latest) {
			latest = r.At
		}
		round, ok := r.OwnerInfo["currentRound"].(float64)
		if !ok || round < 1 || round > math.MaxInt32 {
			continue
		}
		rounds[int32(round)] = append(rounds[int32(round)], r)
		if p == nil {
			p = &v1alpha1.TrainingProgress{}
		}
		p.Round = max(p.Round, int32(round))
	}
	if p == nil {
		return nil
	}
	at := metav1.NewTime(latest.Truncate(time.Second))
	p.LastReportTime = &at
	sums, counts := map[string]float64{}, map[string]int{}
	add := func(k string, v any) {
		if f, ok := v.(float64); ok {
			sums[k] += f
			counts[k]++
		}
	}
	for _, r := range rounds[p.Round] {
		add("sampleCount", r.OwnerInfo["sampleCount"])
		seen := map[string]bool{} // a metric of several model files counts once per trainer: its first
		for _, res := range r.Results {
			for k, v := range res.Metrics {
				if !seen[k] {
					seen[k] = true
					add(k, v)
				}
			}
		}
	}
	for k, v := range sums {
		p.Metrics = append(p.Metrics, v1alpha1.Metric{Key: k, Value: formatNumber(v / float64(counts[k]))})
	}
	sort.Slice(p.Metrics, func(i, j int) bool { return p.Metrics[i].Key < p.Metrics[j].Key })
	p.Metrics = p.Metrics[:min(len(p.Metrics), liveness.MaxMetrics)]
	return p
}

func formatNumber(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.4g", v)
}
