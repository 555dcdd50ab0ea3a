package liveness

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Report is a Sedna worker's report as the controller keeps it: the latest one per worker.
type Report struct {
	Worker    string
	Status    string
	OwnerInfo map[string]any
	Results   []map[string]any
	At        time.Time
}

// ownerKinds maps the report's ownerKind to the workload's Kind.
var ownerKinds = map[string]string{"jointinferenceservice": "JointInferenceService", "federatedlearningjob": "FederatedLearningJob"}

// ownerKey names a workload in the report table and in the subscribers' pending set.
func ownerKey(kind, namespace, name string) string {
	return "report/" + kind + "/" + namespace + "/" + name
}

// applyReport keeps a report, with t.mu held; it returns the key of the workload to wake, or a drop reason.
func (t *Tracker) applyReport(node string, m *lifelinev1.WorkerReport, now time.Time) (string, string) {
	n := t.nodes[node]
	switch {
	case n == nil:
		return "", DropUnknown
	case m.Seq <= n.reportSeq:
		return "", DropReplayed
	}
	var body lifelinev1.Report
	kind, known := "", false
	if err := json.Unmarshal(m.Body, &body); err == nil {
		kind, known = ownerKinds[strings.ToLower(body.OwnerKind)]
	}
	if !known || body.Name != m.Worker || body.Namespace != m.Namespace || body.OwnerName == "" {
		return "", DropForged
	}
	n.reportSeq = m.Seq
	key := ownerKey(kind, body.Namespace, body.OwnerName)
	if t.reports[key] == nil {
		t.reports[key] = map[string]Report{}
	}
	t.reports[key][body.Name] = Report{Worker: body.Name, Status: body.Status, OwnerInfo: body.OwnerInfo, Results: body.Results, At: now}
	return key, ""
}

// Reports returns the latest report of each worker of a workload, by worker name.
func (t *Tracker) Reports(kind, namespace, name string) []Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Report
	for _, r := range t.reports[ownerKey(kind, namespace, name)] {
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
	return out
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
	return p
}

func formatNumber(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.4g", v)
}
