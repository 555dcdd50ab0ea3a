package health

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// StateSources are what the agent's state gauges read, each when scraped.
type StateSources struct {
	// BrokerUp: the MQTT session is up.
	BrokerUp func() bool
	// APIReachable: the node reaches the API server (its watch, and the cloud probe when there is one).
	APIReachable func() bool
	// RuntimeUp: the container runtime answered the agent's latest read.
	RuntimeUp func() bool
	// Oversized: the node's workers that get no stand-in, their pods beyond the agent's size bounds.
	Oversized func() int
	// OfflineRebuilds: workers rebuilt as static pods by the offline policy, cut off from the cloud.
	OfflineRebuilds func() uint64
	// Journal holds what waits for the broker.
	Journal interface {
		LogEntries() int64
		LogBytes() int64
		Dropped() uint64
	}
}

// RegisterMetrics registers, beside the report API's, the Go runtime's and the process's collectors and the
// agent's state: what an operator needs to tell a cut-off node, a silent agent and a growing backlog apart.
func RegisterMetrics(reg prometheus.Registerer, src StateSources) {
	gauge := func(name, help string, value func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, value)
	}
	bool01 := func(f func() bool) func() float64 {
		return func() float64 {
			if f() {
				return 1
			}
			return 0
		}
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		gauge("lifeline_agent_broker_connected", "1 while the agent's MQTT session with the broker is up.", bool01(src.BrokerUp)),
		gauge("lifeline_agent_api_reachable", "1 while the node reaches the API server (its watch, and the cloud probe when there is one).",
			bool01(src.APIReachable)),
		gauge("lifeline_agent_runtime_reachable", "1 while the container runtime answers the agent's reads of the node's workers.",
			bool01(src.RuntimeUp)),
		gauge("lifeline_agent_oversized_workers", "The node's workers that get no stand-in, offline or armed: their pods are beyond the agent's size bounds.",
			func() float64 { return float64(src.Oversized()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lifeline_agent_offline_rebuilds_total",
			Help: "Workers the agent rebuilt as static pods by their offline policy, without the controller's word, since it started."},
			func() float64 { return float64(src.OfflineRebuilds()) }),
		gauge("lifeline_agent_journal_reports", "Reports journaled and not yet acknowledged by the broker.",
			func() float64 { return float64(src.Journal.LogEntries()) }),
		gauge("lifeline_agent_journal_report_bytes", "Bytes of the reports journaled and not yet acknowledged by the broker.",
			func() float64 { return float64(src.Journal.LogBytes()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lifeline_agent_journal_dropped_reports_total",
			Help: "Reports dropped from a full journal, over the journal's life."}, func() float64 { return float64(src.Journal.Dropped()) }),
	)
}
