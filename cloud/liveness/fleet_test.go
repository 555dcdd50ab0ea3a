package liveness

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// The fleet's gauges count the nodes heard by state, the workers down on cut-off nodes, the messages the heard
// agents say wait in their journals and the workers they say get no stand-in (a claim beyond any agent's bound
// counted at the bound); a silent agent's last word on either is not counted.
func TestFleetMetricsCountNodesByStateAndTheJournalsOfAgentsHeard(t *testing.T) {
	b := newBench(t)
	now := time.Now()
	heartbeat := func(node string, reachable bool, journaled, oversized uint32, at time.Time) {
		b.birth(node, 1, "state-"+node, at)
		b.tr.Ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindHeartbeat).String(),
			marshal(&lifelinev1.Heartbeat{BirthSeq: 1, Seq: 1, ApiReachable: reachable, JournalReports: journaled, OversizedWorkers: oversized}), at)
	}
	heartbeat("connected", true, 5, 3, now)
	heartbeat("cut", false, 7, 4_000_000_000, now)
	heartbeat("silent", false, 100, 9, now.Add(-time.Hour))
	b.addPod("cut", "default", "trainer", "u1")
	b.state("cut", &lifelinev1.WorkerState{Namespace: "default", Name: "trainer", Uid: "u1", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newFleetCollector(b.tr))
	want := `
# HELP lifeline_edge_cut_off_workers_down Workers that the agents of nodes cut off from the API server report failed or gone.
# TYPE lifeline_edge_cut_off_workers_down gauge
lifeline_edge_cut_off_workers_down 1
# HELP lifeline_edge_journal_reports Messages waiting in the journals of the agents heard (connected or cut off), as their last heartbeats said.
# TYPE lifeline_edge_journal_reports gauge
lifeline_edge_journal_reports 12
# HELP lifeline_edge_oversized_workers Workers that the agents heard (connected or cut off) keep no stand-in for, their pods beyond the agent's size bounds, as their last heartbeats said: those workers are not healed offline.
# TYPE lifeline_edge_oversized_workers gauge
lifeline_edge_oversized_workers 1027
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lifeline_edge_cut_off_workers_down", "lifeline_edge_journal_reports",
		"lifeline_edge_oversized_workers"); err != nil {
		t.Error(err)
	}
	for state, n := range map[AgentStatus]float64{AgentConnected: 1, AgentCutOff: 1, AgentSilent: 1, AgentStopped: 0} {
		if got := gaugeOf(t, reg, "lifeline_edge_nodes", string(state)); got != n {
			t.Errorf("lifeline_edge_nodes{state=%q} = %v, want %v", state, got, n)
		}
	}
}

func gaugeOf(t *testing.T, reg *prometheus.Registry, name, state string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == state {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{state=%q}", name, state)
	return 0
}
