package liveness

import (
	"encoding/json"
	"sort"
	"time"
	"unicode/utf8"

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
	// MaxMetrics bounds the keys of a report's ownerInfo and of each of its results; a status shows as many.
	MaxMetrics = 32
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
// and booleans, under keys of at most maxMetricKeyLen bytes, the first MaxMetrics keys in order. Nested values
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
	out := make(map[string]any, min(len(keys), MaxMetrics))
	for _, k := range keys[:min(len(keys), MaxMetrics)] {
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
