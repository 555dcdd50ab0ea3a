package liveness

import (
	"fmt"
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
	Results   []map[string]any
	At        time.Time
	node      string // the node it came from
}

// ownerKinds maps the report's ownerKind to the workload's Kind.
var ownerKinds = map[string]string{"jointinferenceservice": "JointInferenceService", "federatedlearningjob": "FederatedLearningJob"}

// What one report may make the controller keep and write into a workload's status.
const (
	// maxMetrics bounds the keys of a report's ownerInfo, of each of its results, and of a status's metrics.
	maxMetrics = 32
	// maxMetricKeyLen and maxMetricValueLen bound a metric's key and a text value (longer keys are left out,
	// longer values cut).
	maxMetricKeyLen   = 64
	maxMetricValueLen = 256
	// maxResults bounds the results (rounds) kept of a report: its latest ones.
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
	key := workloadRef{c.kind, m.Namespace, c.report.OwnerName}
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
	results := c.report.Results[max(0, len(c.report.Results)-maxResults):]
	r := Report{Worker: m.Worker, Status: truncate(c.report.Status, maxMetricValueLen), OwnerInfo: boundMetrics(c.report.OwnerInfo, ""),
		Results: make([]map[string]any, 0, len(results)), At: now, node: node}
	for _, res := range results {
		r.Results = append(r.Results, boundMetrics(res, "round"))
	}
	t.reports[key][m.Worker] = r
	changed.workloads = []workloadRef{key}
	return ""
}

// boundMetrics keeps of a report's metrics what a status may show: numbers, texts (cut to maxMetricValueLen)
// and booleans, under keys of at most maxMetricKeyLen bytes, the first maxMetrics keys in order, the key named
// first (a result's round) before all others; nested values are no metrics.
func boundMetrics(in map[string]any, first string) map[string]any {
	keys := make([]string, 0, len(in))
	for k, v := range in {
		switch v.(type) {
		case float64, string, bool:
			if k != "" && len(k) <= maxMetricKeyLen {
				keys = append(keys, k)
			}
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if fi, fj := keys[i] == first, keys[j] == first; fi != fj {
			return fi
		}
		return keys[i] < keys[j]
	})
	out := make(map[string]any, min(len(keys), maxMetrics))
	for _, k := range keys[:min(len(keys), maxMetrics)] {
		if s, isText := in[k].(string); isText {
			out[k] = truncate(s, maxMetricValueLen)
		} else {
			out[k] = in[k]
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

// TrainingProgress turns the trainers' latest reports into the job's progress: the highest round reported in
// their results, that round's metrics (averaged over the trainers that reported it), and when the latest report
// came; nil when no trainer reported a round.
func TrainingProgress(reports []Report) *v1alpha1.TrainingProgress {
	var p *v1alpha1.TrainingProgress
	var latest time.Time
	rounds := map[int32][]map[string]any{}
	for _, r := range reports {
		for _, res := range r.Results {
			round, ok := res["round"].(float64)
			if !ok {
				continue
			}
			rounds[int32(round)] = append(rounds[int32(round)], res)
			if p == nil {
				p = &v1alpha1.TrainingProgress{}
			}
			p.Round = max(p.Round, int32(round))
		}
		if r.At.After(latest) {
			latest = r.At
		}
	}
	if p == nil {
		return nil
	}
	at := metav1.NewTime(latest.Truncate(time.Second))
	p.LastReportTime = &at
	sums, counts := map[string]float64{}, map[string]int{}
	for _, res := range rounds[p.Round] {
		for k, v := range res {
			if f, ok := v.(float64); ok && k != "round" {
				sums[k] += f
				counts[k]++
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
