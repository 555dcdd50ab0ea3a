package liveness

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Report is a Sedna worker's report as the controller keeps it: the latest one per worker, bounded (see
// boundMetrics).
type Report struct {
	Worker    string
	Status    string
	OwnerInfo map[string]any
	// Results are the models the worker saved (a trainer's), bounded: at most maxResults, metrics as a status
	// may show them (lists as JSON text).
	Results []lifelinev1.ReportResult
	At      time.Time
	node    string // the node it came from
}

// ownerKinds maps the kind of a worker pod's Sedna name label to the workload's Kind.
var ownerKinds = map[string]string{"jointinferenceservice": "JointInferenceService", "federatedlearningjob": "FederatedLearningJob"}

// What one report may make the controller keep and write into a workload's status.
const (
	// maxMetrics bounds the keys of a report's ownerInfo, of each of its results, and of a status's metrics.
	maxMetrics = 32
	// maxMetricKeyLen and maxMetricValueLen bound a metric's key and a text value (longer keys are left out,
	// longer values cut); a result's format and URL are cut to maxMetricValueLen too.
	maxMetricKeyLen   = 64
	maxMetricValueLen = 256
	// maxResults bounds the results (model files) kept of a report: its first ones.
	maxResults = 16
)

// applyReport keeps a report whose body and pod check found true, with t.mu held.
func (t *Tracker) applyReport(node string, m *lifelinev1.WorkerReport, c checked, now time.Time, changed *changes) string {
	n := t.nodes[node]
	switch {
	case n == nil || !n.born:
		return DropUnknown
	case m.Seq <= n.reportSeq:
		return DropReplayed
	}
	key := workloadRef{c.kind, m.Namespace, c.owner}
	old, had := t.reports[key][m.Worker]
	moved := !had || old.node != node
	if moved && n.reports >= maxReportsPerNode {
		return DropOverflow
	}
	n.reportSeq = m.Seq
	if had && moved {
		t.nodes[old.node].reports--
	}
	if moved {
		n.reports++
	}
	if t.reports[key] == nil {
		t.reports[key] = map[string]Report{}
	}
	results := c.report.Results[:min(len(c.report.Results), maxResults)]
	r := Report{Worker: m.Worker, Status: truncate(c.report.Status, maxMetricValueLen), OwnerInfo: boundMetrics(c.report.OwnerInfo, false),
		Results: make([]lifelinev1.ReportResult, 0, len(results)), At: now, node: node}
	for _, res := range results {
		r.Results = append(r.Results, lifelinev1.ReportResult{Format: truncate(res.Format, maxMetricValueLen),
			URL: truncate(res.URL, maxMetricValueLen), Metrics: boundMetrics(res.Metrics, true)})
	}
	t.reports[key][m.Worker] = r
	changed.workloads = []workloadRef{key}
	return ""
}

// boundMetrics keeps of a report's metrics what a status may show: numbers, texts (cut to maxMetricValueLen)
// and booleans, under keys of at most maxMetricKeyLen bytes, the first maxMetrics keys in order. Nested values
// (lists, objects) are no metrics, unless encode: then they are kept as their JSON text, cut, as Sedna's GM
// shows a model's list-valued metrics.
func boundMetrics(in map[string]any, encode bool) map[string]any {
	keys := make([]string, 0, len(in))
	for k, v := range in {
		if k == "" || len(k) > maxMetricKeyLen {
			continue
		}
		switch v.(type) {
		case float64, string, bool:
			keys = append(keys, k)
		case []any, map[string]any:
			if encode {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	out := make(map[string]any, min(len(keys), maxMetrics))
	for _, k := range keys[:min(len(keys), maxMetrics)] {
		switch v := in[k].(type) {
		case string:
			out[k] = truncate(v, maxMetricValueLen)
		case []any, map[string]any:
			text, _ := json.Marshal(v) // decoded from JSON: encodes again
			out[k] = truncate(string(text), maxMetricValueLen)
		default:
			out[k] = v
		}
	}
	return out
}

// truncate cuts s to at most n bytes, on a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Reports returns the latest report of each worker of a workload, by worker name.
func (t *Tracker) Reports(kind, namespace, name string) []Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Report
	for _, r := range t.reports[workloadRef{kind, namespace, name}] {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

// ServiceMetrics turns the JI edge workers' latest reports into the service's status.metrics (Sedna's
// inferenceNumber, hardExampleNumber, uploadCloudRatio, ... as reported), summed over workers for numbers; nil
// when no worker reported.
func ServiceMetrics(reports []Report) []v1alpha1.Metric {
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
	return out[:min(len(out), maxMetrics)]
}

// TrainingProgress turns the trainers' latest reports into the job's progress: the highest round a trainer
// reported (Sedna's ownerInfo.currentRound), that round's numeric metrics — the models' metrics and the
// sampleCount — averaged over the trainers that reported it, and when the latest report came; nil when no
// trainer reported a round.
func TrainingProgress(reports []Report) *v1alpha1.TrainingProgress {
	var p *v1alpha1.TrainingProgress
	var latest time.Time
	rounds := map[int32][]Report{}
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
	p.Metrics = p.Metrics[:min(len(p.Metrics), maxMetrics)]
	return p
}

func formatNumber(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.4g", v)
}
