package scale

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/lifeline-edge/lifeline/edge/journal"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name, stat string
		want       time.Duration
		wantErr    bool
	}{
		{name: "plain", stat: "42 (lifeline-contr) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 0",
			want: 3 * time.Second},
		{name: "a command name with spaces and parentheses",
			stat: "42 (a (b) c) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 1 0", want: 100 * time.Millisecond},
		{name: "truncated", stat: "42 (x) S 1 2 3", wantErr: true},
		{name: "no command", stat: "garbage", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatCPU(tt.stat)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseStatCPU = %v, %v; want %v (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseStatusKiB(t *testing.T) {
	status := "Name:\tlifeline\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
	tests := []struct {
		key  string
		want int64
	}{{"VmRSS:", 102400}, {"VmHWM:", 204800}, {"VmSwap:", 0}}
	for _, tt := range tests {
		if got := parseStatusKiB(status, tt.key); got != tt.want {
			t.Errorf("parseStatusKiB(%s) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestParseHistograms(t *testing.T) {
	text := `# HELP controller_runtime_reconcile_time_seconds Length of time per reconciliation per controller
# TYPE controller_runtime_reconcile_time_seconds histogram
controller_runtime_reconcile_time_seconds_bucket{controller="ji",le="0.01"} 2
controller_runtime_reconcile_time_seconds_bucket{controller="ji",le="0.1"} 8
controller_runtime_reconcile_time_seconds_bucket{controller="ji",le="+Inf"} 10
controller_runtime_reconcile_time_seconds_sum{controller="ji"} 1.5
controller_runtime_reconcile_time_seconds_count{controller="ji"} 10
controller_runtime_reconcile_time_seconds_bucket{controller="fl",le="+Inf"} 0
controller_runtime_reconcile_total{controller="ji",result="success"} 10
`
	got, err := parseHistograms(strings.NewReader(text), "controller_runtime_reconcile_time_seconds", "controller")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]histogram{"ji": {0.01: 2, 0.1: 8, math.Inf(1): 10}, "fl": {math.Inf(1): 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseHistograms (-want +got):\n%s", diff)
	}
	const apiserver = `apiserver_request_duration_seconds_bucket{component="apiserver",resource="pods",subresource="",verb="PATCH",le="0.1"} 7
apiserver_request_duration_seconds_bucket{component="apiserver",resource="pods",subresource="status",verb="PATCH",le="0.1"} 3
apiserver_request_duration_seconds_bucket{component="apiserver",resource="pods",subresource="status",verb="GET",le="0.1"} 5
apiserver_request_duration_seconds_bucket{component="apiserver",resource="nodes",subresource="status",verb="PATCH",le="0.1"} 2
`
	got, err = parseHistograms(strings.NewReader(apiserver), "apiserver_request_duration_seconds", "resource", "verb=PATCH", "subresource=status")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]histogram{"pods": {0.1: 3}, "nodes": {0.1: 2}}, got); diff != "" {
		t.Errorf("parseHistograms of PATCH status only (-want +got):\n%s", diff)
	}
	if byController, err := parseGauges(strings.NewReader(text), "controller_runtime_reconcile_total", "controller"); err != nil || byController["ji"] != 10 {
		t.Errorf("parseGauges of a counter = %v, %v; want ji 10", byController, err)
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := histogram{0.01: 2, 0.1: 8, 1: 10, math.Inf(1): 10}
	tests := []struct {
		name string
		h    histogram
		q    float64
		want float64
	}{
		{"in the first bucket, from zero", h, 0.1, 0.005},
		{"interpolated in the second bucket", h, 0.5, 0.01 + 0.09*(5.0-2)/(8-2)},
		{"in the last finite bucket", h, 0.99, 0.1 + 0.9*(9.9-8)/(10-8)},
		{"past every finite bound: the highest one", histogram{0.5: 1, math.Inf(1): 4}, 0.99, 0.5},
		{"empty", histogram{math.Inf(1): 0}, 0.5, 0},
		{"since an earlier scrape", histogram{0.01: 5, 0.1: 10, math.Inf(1): 10}.minus(histogram{0.01: 5, 0.1: 5, math.Inf(1): 5}), 0.5,
			0.01 + 0.09*2.5/5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.h.quantile(tt.q); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func TestMemJournalKeepsTheLatestStateOfAKey(t *testing.T) {
	j := newMemJournal()
	for _, e := range []struct{ topic, key string }{{"a", "w1"}, {"b", ""}, {"c", "w1"}, {"d", "w2"}} {
		if _, err := j.Put(journalEntry(e.topic, e.key)); err != nil {
			t.Fatal(err)
		}
	}
	pending, _ := j.Pending()
	var topics []string
	for _, e := range pending {
		topics = append(topics, e.Topic)
	}
	if diff := cmp.Diff([]string{"b", "c", "d"}, topics); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
	if err := j.Ack(pending[1].Seq); err != nil {
		t.Fatal(err)
	}
	if pending, _ = j.Pending(); len(pending) != 2 || pending[0].Topic != "b" || pending[1].Topic != "d" {
		t.Errorf("after acknowledging c: %+v", pending)
	}
}

func journalEntry(topic, key string) journal.Entry {
	return journal.Entry{Topic: topic, Key: key, QoS: 1}
}

// The harness runs the controller as if under the chart's memory limit; the two must not drift apart.
func TestChartMemoryLimitIsTheHarnessDefault(t *testing.T) {
	data, err := os.ReadFile("../../deploy/chart/lifeline/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Controller struct {
			Resources corev1.ResourceRequirements `json:"resources"`
		} `json:"controller"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	if got := values.Controller.Resources.Limits.Memory().Value(); got != ChartMemoryLimit {
		t.Errorf("the chart limits the controller to %d bytes, the harness assumes %d", got, ChartMemoryLimit)
	}
}

func TestParseMachineStat(t *testing.T) {
	const before = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\ncpu1 50 0 25 400 25 0 0 0 0 0\nintr 1\n"
	const after = "cpu  250 0 100 1000 50 0 0 0 0 0\ncpu0 125 0 50 500 25 0 0 0 0 0\ncpu1 125 0 50 500 25 0 0 0 0 0\nintr 2\n"
	b, err := parseMachineStat(before)
	if err != nil {
		t.Fatal(err)
	}
	a, err := parseMachineStat(after)
	if err != nil {
		t.Fatal(err)
	}
	// 200 busy ticks of 400 on 2 CPUs: one core.
	if a.cpus != 2 || a.busyCores(b) != 1 {
		t.Errorf("got %d CPUs, %v busy cores; want 2, 1", a.cpus, a.busyCores(b))
	}
	if _, err := parseMachineStat("intr 1\n"); err == nil {
		t.Error("a /proc/stat without a cpu line parsed")
	}
}

func TestParseGaugesSumsOverOtherLabels(t *testing.T) {
	const text = `# TYPE workqueue_depth gauge
workqueue_depth{controller="jointinferenceservice",name="jointinferenceservice",priority=""} 3
workqueue_depth{controller="jointinferenceservice",name="jointinferenceservice",priority="10"} 1
workqueue_depth{controller="federatedlearningjob",name="federatedlearningjob",priority=""} 0
workqueue_depth_other{name="jointinferenceservice"} 7
`
	got, err := parseGauges(strings.NewReader(text), "workqueue_depth", "name")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{"jointinferenceservice": 4, "federatedlearningjob": 0}, got); diff != "" {
		t.Errorf("parseGauges (-want +got):\n%s", diff)
	}
}

func TestParseValuesReadsUnlabelledSeriesOnly(t *testing.T) {
	const text = `# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.5
go_gc_duration_seconds_count 224
go_memstats_next_gc_bytes 1.44885632e+08
go_memstats_next_gc_bytes_other 3
`
	got, err := parseValues(strings.NewReader(text), gcCycles, heapGoal, stacks)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{gcCycles: 224, heapGoal: 144885632}, got); diff != "" {
		t.Errorf("parseValues (-want +got):\n%s", diff)
	}
	if _, err := parseValues(strings.NewReader("go_memstats_next_gc_bytes many\n"), heapGoal); err == nil {
		t.Error("an unparsable value parsed")
	}
}

func TestParseGaugesGroupsBySeveralLabels(t *testing.T) {
	const text = `apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 5
apiserver_request_total{code="409",resource="pods",subresource="",verb="POST"} 2
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 3
apiserver_request_total{code="200",resource="services",verb="POST"} 1
`
	got, err := parseGauges(strings.NewReader(text), "apiserver_request_total", "verb", "resource", "subresource")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"POST/pods": 7, "PATCH/pods/status": 3, "POST/services": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseGauges (-want +got):\n%s", diff)
	}
}

// The keys that grew the most come first, with the total of all growth.
func TestBusiest(t *testing.T) {
	before := map[string]float64{"pods": 10, "services": 5, "leases": 100}
	after := map[string]float64{"pods": 40, "services": 25, "leases": 100, "events": 20}
	if got, want := busiest(before, after, 2), "70, pods 30, events 20"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
