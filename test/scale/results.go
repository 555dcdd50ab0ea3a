package scale

import (
	"fmt"
	"time"

	"github.com/lifeline-edge/lifeline/test/harness"
)

type metric struct {
	value float64
	unit  string
}

func (r *Result) metrics() []metric {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	jiP50, rsP50 := harness.Percentile(r.RecreateJI, 50), harness.Percentile(r.RecreateRS, 50)
	out := []metric{
		{r.ChildrenLifeline.Seconds() / r.ChildrenRaw.Seconds(), "children-ratio-to-raw"},
		{r.ChildrenLifeline.Seconds(), "children-s"},
		{r.ChildrenRaw.Seconds(), "children-raw-s"},
		{r.StatusSettled.Seconds(), "status-settled-s"},
		{r.Reconciles["jointinferenceservice"] + r.Reconciles["federatedlearningjob"], "reconciles"},
		{float64(r.ControllerPeakRSS) / (1 << 20), "controller-rss-MiB"},
		{r.ControllerCores, "controller-cpu-cores"},
		{r.IngestionCores, "ingestion-cores"},
		{r.MessagesPerSecond, "ingested-msgs/s"},
		{r.ReportingCores, "reporting-cores"},
		{r.ReportingMessagesPerSecond, "reporting-msgs/s"},
		{ms(harness.Percentile(r.Detect, 50)), "detect-p50-ms"},
		{ms(harness.Percentile(r.Detect, 99)), "detect-p99-ms"},
		{ms(harness.Percentile(r.DetectBehindReports, 50)), "detect-behind-reports-p50-ms"},
		{ms(harness.Percentile(r.DetectBehindReports, 99)), "detect-behind-reports-p99-ms"},
		{r.MassCutoff.Seconds(), "mass-cutoff-s"},
		{r.OutageAll.Seconds(), "outage-all-s"},
		{r.OutageHeal.Seconds(), "outage-heal-s"},
		{r.OutageRaw.Seconds(), "outage-raw-s"},
		{r.OutageAll.Seconds() / r.OutageRaw.Seconds(), "outage-ratio-to-raw"},
		{r.HealRaw.Seconds(), "heal-raw-s"},
		{r.OutageHeal.Seconds() / r.HealRaw.Seconds(), "heal-ratio-to-raw"},
		{ms(jiP50), "recreate-ji-p50-ms"},
		{ms(rsP50), "recreate-rs-p50-ms"},
		{jiP50.Seconds() / rsP50.Seconds(), "recreate-ratio-to-rs"},
		{float64(r.StandInsArmed), "stand-ins-armed"},
		{r.Armed.Seconds(), "arming-s"},
		{float64(r.APIServerRSS) / (1 << 20), "apiserver-rss-MiB"},
		{float64(r.EtcdRSS) / (1 << 20), "etcd-rss-MiB"},
		{r.RestartReconnect.Seconds(), "controller-restart-reconnect-s"},
		{r.RestartPeakAttempts, "controller-restart-peak-attempts/s"},
	}
	for _, c := range []string{"jointinferenceservice", "federatedlearningjob"} {
		short := map[string]string{"jointinferenceservice": "ji", "federatedlearningjob": "fl"}[c]
		out = append(out, metric{r.ReconcileP50[c] * 1000, "reconcile-" + short + "-p50-ms"},
			metric{r.ReconcileP99[c] * 1000, "reconcile-" + short + "-p99-ms"})
	}
	return out
}

// Lines are the figures as `name value unit` lines, one per metric, to compare run to run.
func (r *Result) Lines() []string {
	lines := []string{fmt.Sprintf("scale/nodes=%d/workers %d workers", r.Nodes, r.Workers)}
	for _, m := range r.metrics() {
		lines = append(lines, fmt.Sprintf("scale/nodes=%d %.3f %s", r.Nodes, m.value, m.unit))
	}
	return lines
}
