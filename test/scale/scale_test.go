package scale

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/test/harness"
)

var (
	nodesFlag          = flag.String("scale.nodes", "100", "comma-separated fleet sizes BenchmarkScale runs at, one after the other")
	controllerArgsFlag = flag.String("scale.controller-args", "", "space-separated extra flags for lifeline-controller")
	memoryLimitFlag    = flag.Int64("scale.memory-limit-mib", ChartMemoryLimit>>20, "container memory limit the controller runs as if under (its soft limit is 90 %); 0: none")
	profileDirFlag     = flag.String("scale.profile-dir", "", "directory that receives the controller's heap and CPU profiles of each run, what it allocated during the outage, its heal and their anchors, and the API server's and the harness's CPU profiles of those")
	cutOffsOnlyFlag    = flag.Bool("scale.cut-offs-only", false, "measure only the mass cut-off, the outage, its heal and their anchors, once the workloads have settled")
	childrenOnlyFlag   = flag.Bool("scale.children-only", false, "measure only the workloads' children and their anchor")
	armStandInsFlag    = flag.Bool("scale.arm-stand-ins", true, "every edge worker's stand-in armed, its mirror pod made by its node, as the chart's default has it; false: as with agent.armStandIns=false")
)

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuilds()
	os.Exit(code)
}

// TestScaleSmoke runs the whole harness on a small fleet and checks that each figure measures something real:
// every child and status was seen, every death was detected in the agent's word, the controller was read from
// /proc. It asserts no timing.
func TestScaleSmoke(t *testing.T) {
	harness.SkipIfShort(t)
	r := Run(t, Config{Nodes: 10, Recreations: 3, SteadyWindow: 3 * time.Second, NodeGrace: 12 * time.Second, Progress: os.Stderr})
	if r.Children != 10*(3+2+TrainersPerJob) || r.ChildrenLifeline <= 0 || r.ChildrenRaw <= 0 {
		t.Errorf("children: %d, Lifeline %v, raw %v", r.Children, r.ChildrenLifeline, r.ChildrenRaw)
	}
	if r.Reconciles["jointinferenceservice"] < 10 || r.Reconciles["federatedlearningjob"] < 10 {
		t.Errorf("reconciles counted from the controller's metrics: %v", r.Reconciles)
	}
	if r.ControllerPeakRSS < 1<<20 || r.ControllerRSS <= 0 || r.ControllerCores <= 0 {
		t.Errorf("controller: RSS %d, peak %d, %.3f cores", r.ControllerRSS, r.ControllerPeakRSS, r.ControllerCores)
	}
	// Ten agents heartbeat once a second, then also report every 2 s: a 3 s window holds one or two reports of each.
	// The reports are counted apart: a window's heartbeats vary by a few (a late one falls into the next window).
	if r.MessagesPerSecond < 8 || r.ReportingMessagesPerSecond < 8 || r.ReportsPerSecond < 2 {
		t.Errorf("%.1f, then %.1f messages/s reached the controller's table, %.1f/s of them reports; want the heartbeats', then the reports' too",
			r.MessagesPerSecond, r.ReportingMessagesPerSecond, r.ReportsPerSecond)
	}
	if len(r.Detect) != 5 || len(r.DetectBehindReports) != 5 {
		t.Errorf("%d and %d deaths detected, want 5 and 5", len(r.DetectBehindReports), len(r.Detect))
	}
	// Each cut-off node holds a JI edge worker and TrainersPerJob trainers.
	if r.CutOffWorkers != 5*(1+TrainersPerJob) || r.MassCutoff <= 0 || r.NodesUnknown < r.MassCutoff {
		t.Errorf("mass cut-off: %d workers in %v, nodes not Ready after %v", r.CutOffWorkers, r.MassCutoff, r.NodesUnknown)
	}
	if r.OutageAll <= 0 || r.OutageHeal <= 0 || r.OutageRaw <= 0 || r.HealRaw <= 0 {
		t.Errorf("outage: every node cut in %v, mended in %v, the anchors' writes in %v and %v", r.OutageAll, r.OutageHeal, r.OutageRaw, r.HealRaw)
	}
	// Each edge node's workers have their stand-ins armed, as the chart's default has it: a mirror pod each.
	if r.StandInsArmed < 10*(1+TrainersPerJob) || r.Armed <= 0 || r.APIServerRSS <= 0 || r.EtcdRSS <= 0 {
		t.Errorf("arming: %d stand-ins armed in %v; API server %d bytes, etcd %d", r.StandInsArmed, r.Armed, r.APIServerRSS, r.EtcdRSS)
	}
	if len(r.RecreateJI) != 3 || len(r.RecreateRS) != 3 {
		t.Errorf("re-creations: %d and %d samples", len(r.RecreateJI), len(r.RecreateRS))
	}
	for _, line := range r.Lines() {
		t.Log(line)
	}
}

// memoryLimit turns -scale.memory-limit-mib into Config.MemoryLimit, where 0 means the default.
func memoryLimit(mib int64) int64 {
	if mib <= 0 {
		return -1
	}
	return mib << 20
}

// BenchmarkScale runs the harness at each size of -scale.nodes and prints the figures (make bench-scale).
func BenchmarkScale(b *testing.B) {
	harness.SkipIfShort(b)
	if *cutOffsOnlyFlag && *childrenOnlyFlag {
		b.Fatal("-scale.cut-offs-only and -scale.children-only each measure a part of a run: ask for one")
	}
	for _, s := range strings.Split(*nodesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 {
			b.Fatalf("-scale.nodes: %q is not a fleet size", s)
		}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			r := Run(b, Config{Nodes: n, Progress: os.Stderr, ControllerArgs: strings.Fields(*controllerArgsFlag),
				ProfileDir: *profileDirFlag, MemoryLimit: memoryLimit(*memoryLimitFlag), CutOffsOnly: *cutOffsOnlyFlag,
				ChildrenOnly: *childrenOnlyFlag, DisarmStandIns: !*armStandInsFlag})
			r.report(b)
			for _, line := range r.Lines() {
				fmt.Println(line)
			}
		})
	}
}

// report adds the figures to the benchmark's line.
func (r *Result) report(b *testing.B) {
	for _, m := range r.metrics() {
		b.ReportMetric(m.value, m.unit)
	}
}
