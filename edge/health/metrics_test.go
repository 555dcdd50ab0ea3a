package health

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/lifeline-edge/lifeline/edge/journal"
)

// An operator scraping a cut-off agent with a backlog sees it in the agent's own metrics, beside the Go and
// process ones, and every metric passes promlint.
func TestAgentMetricsTellItsStateAndPassPromlint(t *testing.T) {
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for range 3 {
		if _, err := j.Put(journal.Entry{Topic: "r", Payload: []byte("report")}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	RegisterMetrics(reg, StateSources{BrokerUp: func() bool { return false }, APIReachable: func() bool { return false }, Journal: j,
		RuntimeUp: func() bool { return true }, OfflineRebuilds: func() uint64 { return 2 }, Oversized: func() int { return 4 }})
	want := `
# HELP lifeline_agent_api_reachable 1 while the node reaches the API server (its watch, and the cloud probe when there is one).
# TYPE lifeline_agent_api_reachable gauge
lifeline_agent_api_reachable 0
# HELP lifeline_agent_broker_connected 1 while the agent's MQTT session with the broker is up.
# TYPE lifeline_agent_broker_connected gauge
lifeline_agent_broker_connected 0
# HELP lifeline_agent_journal_reports Reports journaled and not yet acknowledged by the broker.
# TYPE lifeline_agent_journal_reports gauge
lifeline_agent_journal_reports 3
# HELP lifeline_agent_offline_rebuilds_total Workers the agent rebuilt as static pods by their offline policy, without the controller's word, since it started.
# TYPE lifeline_agent_offline_rebuilds_total counter
lifeline_agent_offline_rebuilds_total 2
# HELP lifeline_agent_oversized_workers The node's workers that get no stand-in, offline or armed: their pods are beyond the agent's size bounds.
# TYPE lifeline_agent_oversized_workers gauge
lifeline_agent_oversized_workers 4
# HELP lifeline_agent_runtime_reachable 1 while the container runtime answers the agent's reads of the node's workers.
# TYPE lifeline_agent_runtime_reachable gauge
lifeline_agent_runtime_reachable 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lifeline_agent_api_reachable",
		"lifeline_agent_broker_connected", "lifeline_agent_journal_reports", "lifeline_agent_offline_rebuilds_total",
		"lifeline_agent_oversized_workers", "lifeline_agent_runtime_reachable"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "go_goroutines", "process_resident_memory_bytes"); err != nil || n != 2 {
		t.Errorf("Go and process metrics: %d (%v), want both", n, err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}
