package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
)

// costWindow records, over one step, what each process of the run used of the machine, and the waits a status
// goes through: the controller's work queue, its passes, and the API server's status writes. It tells which of
// them bounds a latency the step measures.
type costWindow struct {
	h       *scaleRun
	procs   map[string]procSample
	machine machineSample
	start   waits
}

// waits is what the controller's and the API server's metrics say at one moment.
type waits struct {
	queue     map[string]histogram // by controller: time a request waited in the work queue
	work      map[string]histogram // by controller: time a pass took
	apiserver map[string]histogram // by resource: the API server's status writes (PUT)
	creates   map[string]histogram // by resource: the API server's creations
	requests  map[string]float64   // by verb/resource/subresource: every request the API server answered
	own       map[string]float64   // by method: the requests the controller sent, its Events' among them
	runtime   map[string]float64   // the controller's Go runtime, by series (gcCycles and the others below)
}

// The series the controller's metrics give of its Go collector: the cycles it ran, and what bounds
// its heap goal (the soft memory limit counts the stacks and the runtime's own memory beside the heap).
const (
	gcCycles  = "go_gc_duration_seconds_count"
	heapGoal  = "go_memstats_next_gc_bytes"
	heapInUse = "go_memstats_heap_alloc_bytes"
	stacks    = "go_memstats_stack_inuse_bytes"
	softLimit = "go_gc_gomemlimit_bytes"
)

// openCostWindow samples the start of a step.
func (h *scaleRun) openCostWindow() *costWindow {
	w := &costWindow{h: h, start: h.sampleWaits()} // first: rendering the API server's metrics costs it CPU
	var err error
	w.procs, err = h.sampleComponents()
	h.check(err)
	w.machine, err = sampleMachine()
	h.check(err)
	return w
}

// report samples the end of the step and prints, one line each under the step's name: the cores each process
// used, the waits' p50 and p99, and the API server's busiest resources.
func (w *costWindow) report(step string) {
	for _, line := range w.close() {
		w.h.progress("%s: %s", step, line)
	}
}

// close samples the end of the step and describes it.
func (w *costWindow) close() []string {
	h := w.h
	procs, err := h.sampleComponents()
	h.check(err)
	machine, err := sampleMachine()
	h.check(err)
	end := h.sampleWaits()

	names := make([]string, 0, len(procs))
	for name := range procs {
		names = append(names, name)
	}
	sort.Strings(names)
	var used []string
	for _, name := range names {
		used = append(used, fmt.Sprintf("%s %.2f", name, cores(w.procs[name], procs[name])))
	}
	lines := []string{fmt.Sprintf("cores: machine %.2f busy of %d; %s", machine.busyCores(w.machine), machine.cpus, strings.Join(used, ", "))}
	describe := func(what string, before, after map[string]histogram, group string) {
		d := after[group].minus(before[group])
		lines = append(lines, fmt.Sprintf("%s: %.0f, p50 %.0f ms, p99 %.0f ms", what, d.count(), 1000*d.quantile(0.5), 1000*d.quantile(0.99)))
	}
	describe("JI work-queue waits", w.start.queue, end.queue, "jointinferenceservice")
	describe("JI passes", w.start.work, end.work, "jointinferenceservice")
	describe("API server JI status writes", w.start.apiserver, end.apiserver, "jointinferenceservices")
	for _, resource := range []string{"services", "deployments", "pods"} {
		if end.creates[resource].minus(w.start.creates[resource]).count() > 0 {
			describe("API server "+resource+" created", w.start.creates, end.creates, resource)
		}
	}
	lines = append(lines, "API server requests: "+busiest(w.start.requests, end.requests, 16))
	lines = append(lines, "the controller's requests: "+busiest(w.start.own, end.own, 8))
	mib := func(series string) float64 { return end.runtime[series] / (1 << 20) }
	lines = append(lines, fmt.Sprintf("the controller's collector: %.0f cycles; at the end heap %.0f MiB, goal %.0f MiB, stacks %.0f MiB, soft limit %.0f MiB",
		end.runtime[gcCycles]-w.start.runtime[gcCycles], mib(heapInUse), mib(heapGoal), mib(stacks), mib(softLimit)))
	return lines
}

// busiest describes the n keys whose counts grew the most from before to after, the most first.
func busiest(before, after map[string]float64, n int) string {
	type grown struct {
		key string
		by  float64
	}
	var all []grown
	total := 0.0
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			all = append(all, grown{k, d})
			total += d
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].by > all[j].by || all[i].by == all[j].by && all[i].key < all[j].key })
	parts := []string{fmt.Sprintf("%.0f", total)}
	for _, g := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("%s %.0f", g.key, g.by))
	}
	return strings.Join(parts, ", ")
}

// sampleWaits reads the controller's metrics and the API server's, once each.
func (h *scaleRun) sampleWaits() waits {
	resp, err := http.Get(h.metricsURL)
	h.check(err)
	controller, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	h.check(err)
	if resp.StatusCode != http.StatusOK {
		h.check(fmt.Errorf("scraping %s: %s", h.metricsURL, resp.Status))
	}
	apiserver, err := h.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	h.check(err)
	var w waits
	w.queue, err = parseHistograms(bytes.NewReader(controller), "workqueue_queue_duration_seconds", "name")
	h.check(err)
	w.work, err = parseHistograms(bytes.NewReader(controller), "controller_runtime_reconcile_time_seconds", "controller")
	h.check(err)
	w.own, err = parseGauges(bytes.NewReader(controller), "rest_client_requests_total", "method")
	h.check(err)
	w.runtime, err = parseValues(bytes.NewReader(controller), gcCycles, heapGoal, heapInUse, stacks, softLimit)
	h.check(err)
	w.apiserver, err = parseHistograms(bytes.NewReader(apiserver), "apiserver_request_duration_seconds", "resource", "verb=PUT", "subresource=status")
	h.check(err)
	w.creates, err = parseHistograms(bytes.NewReader(apiserver), "apiserver_request_duration_seconds", "resource", "verb=POST", "subresource=")
	h.check(err)
	w.requests, err = parseGauges(bytes.NewReader(apiserver), "apiserver_request_total", "verb", "resource", "subresource")
	h.check(err)
	return w
}

// sampleComponents samples every process of the run: the control plane's, kwok, the controller, and this one
// (the harness and the agents it plays).
func (h *scaleRun) sampleComponents() (map[string]procSample, error) {
	out := map[string]procSample{}
	for _, p := range h.cp.Components() {
		s, err := sampleProc(p.Pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name(), err)
		}
		out[p.Name()] = s
	}
	s, err := sampleProc(os.Getpid())
	if err != nil {
		return nil, err
	}
	out["harness"] = s
	return out, nil
}

// machineSample is the machine's CPU time, busy and all, from /proc/stat.
type machineSample struct {
	busy, total int64 // clock ticks
	cpus        int
}

func sampleMachine() (machineSample, error) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineSample{}, fmt.Errorf("reading the machine's CPU time: %w", err)
	}
	return parseMachineStat(string(stat))
}

// parseMachineStat reads the "cpu" line of /proc/stat: user nice system idle iowait irq softirq steal; idle and
// iowait are the time not busy. It counts the "cpuN" lines.
func parseMachineStat(stat string) (machineSample, error) {
	var s machineSample
	found := false
	for _, line := range strings.Split(stat, "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case fields[0] == "cpu":
			if len(fields) < 9 {
				return s, fmt.Errorf("short /proc/stat line %q", line)
			}
			for i, f := range fields[1:9] {
				v, err := strconv.ParseInt(f, 10, 64)
				if err != nil {
					return s, fmt.Errorf("unparsable /proc/stat line %q: %w", line, err)
				}
				s.total += v
				if i != 3 && i != 4 {
					s.busy += v
				}
			}
			found = true
		case strings.HasPrefix(fields[0], "cpu"):
			s.cpus++
		}
	}
	if !found {
		return s, fmt.Errorf("no cpu line in /proc/stat")
	}
	return s, nil
}

// busyCores is how many of the machine's cores were busy, on average, since before.
func (s machineSample) busyCores(before machineSample) float64 {
	total := s.total - before.total
	if total <= 0 {
		return 0
	}
	return float64(s.cpus) * float64(s.busy-before.busy) / float64(total)
}
