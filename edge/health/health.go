// Package health is what the agent tells about itself: its liveness and readiness probes (/healthz, /readyz),
// the first-failure log lines of its dependencies (the runtime, the broker, the pod source), and its metrics. It
// exists so that the policies an operator and the kubelet judge the agent by are one place apart from the work
// they judge; the agent's loop only tells it its turns (agent.LoopProbe).
package health

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/internal/lograte"
)

// Dependency names, as the readiness probe and the first-failure log lines say them.
const (
	DepRuntime = "runtime"    // the container runtime, through its CRI socket
	DepBroker  = "broker"     // the MQTT broker
	DepPods    = "api-server" // where the node's pods are read: the API server, or KubeEdge's MetaServer
)

// Loop names, as the liveness probe says them.
const (
	LoopAgent      = "agent"      // the loop that reads the runtime, runs the offline policy and executes commands
	LoopHeartbeats = "heartbeats" // the loop that publishes heartbeats
)

// StallAfter is how long a loop of the given period may go without a turn before the liveness probe takes it
// as wedged: ten periods, and never less than two minutes, longer than any single action the agent waits on
// (a restart or a rebuild, 15 s each), so a busy loop is not mistaken for a stuck one.
func StallAfter(period time.Duration) time.Duration { return max(2*time.Minute, 10*period) }

// RuntimeFreshness is how recently the runtime must have answered, with the runtime read every poll, for the
// agent to be ready: four reads, and never less than 10 s, so a runtime restarting (seconds) does not flap it.
func RuntimeFreshness(poll time.Duration) time.Duration { return max(10*time.Second, 4*poll) }

// LoopState is one loop as the liveness probe judges it.
type LoopState struct {
	Name string
	// Last is when it last turned (or, before its first turn, when the agent started).
	Last       time.Time
	StallAfter time.Duration
}

// Alive is the liveness policy: every loop turned within its StallAfter. It returns one line per loop, in the
// order given, saying so.
func Alive(now time.Time, loops []LoopState) (bool, []string) {
	alive := true
	lines := make([]string, 0, len(loops))
	for _, l := range loops {
		since := now.Sub(l.Last).Round(time.Millisecond)
		if since > l.StallAfter {
			alive = false
			lines = append(lines, fmt.Sprintf("[-]%s failed: no turn for %s (wedged after %s)", l.Name, since, l.StallAfter))
			continue
		}
		lines = append(lines, fmt.Sprintf("[+]%s ok: turned %s ago", l.Name, since))
	}
	return alive, lines
}

// RuntimeState is the container runtime as the readiness probe judges it.
type RuntimeState struct {
	Address string
	// LastAnswer is when a read of it last succeeded; zero: never since the agent started.
	LastAnswer time.Time
	// Err is why the latest read failed; nil when it succeeded.
	Err error
}

// SessionState is the broker, or the pod source, as the readiness probe judges it.
type SessionState struct {
	Name, Address string
	// EverUp: it answered (the broker: a session was established) at least once since the agent started.
	EverUp bool
	// Up: it answers now.
	Up bool
	// Err is the latest failure the agent saw; nil when none.
	Err error
}

// Readiness is what the readiness policy reads.
type Readiness struct {
	Now          time.Time
	Runtime      RuntimeState
	RuntimeFresh time.Duration
	Broker, Pods SessionState
}

// Ready is the readiness policy: the runtime answered within RuntimeFresh, and the broker and the pod source each
// answered at least once since the agent started. A later loss of the broker or of the API server does not make
// the agent unready: on the edge that is normal life, which the agent is made for (it journals what it cannot
// send, and heals by its offline policy), and an agent unready on every cut-off node would stall the DaemonSet's
// rolling updates across the fleet. The runtime is on the node itself: an agent that cannot read it cannot do
// its work. It returns one line per dependency (runtime, broker, pod source) saying why.
func Ready(r Readiness) (bool, []string) {
	ready := true
	var lines []string
	rt := r.Runtime
	switch {
	case rt.LastAnswer.IsZero():
		ready = false
		lines = append(lines, fmt.Sprintf("[-]%s failed: no answer since the agent started (%s): %s", DepRuntime, rt.Address, reason(rt.Err)))
	case r.Now.Sub(rt.LastAnswer) > r.RuntimeFresh:
		ready = false
		lines = append(lines, fmt.Sprintf("[-]%s failed: last answer %s ago, more than %s (%s): %s", DepRuntime,
			r.Now.Sub(rt.LastAnswer).Round(time.Millisecond), r.RuntimeFresh, rt.Address, reason(rt.Err)))
	default:
		lines = append(lines, fmt.Sprintf("[+]%s ok: answered %s ago (%s)", DepRuntime, r.Now.Sub(rt.LastAnswer).Round(time.Millisecond), rt.Address))
	}
	for _, s := range []SessionState{r.Broker, r.Pods} {
		switch {
		case !s.EverUp:
			ready = false
			lines = append(lines, fmt.Sprintf("[-]%s failed: not reached since the agent started (%s): %s", s.Name, s.Address, reason(s.Err)))
		case s.Up:
			lines = append(lines, fmt.Sprintf("[+]%s ok: reached (%s)", s.Name, s.Address))
		default:
			lines = append(lines, fmt.Sprintf("[+]%s ok: reached since the agent started, out of reach now (%s): the edge's normal life, not a reason to be unready",
				s.Name, s.Address))
		}
	}
	return ready, lines
}

func reason(err error) string {
	if err == nil {
		return "no attempt has ended yet"
	}
	return err.Error()
}

// Failure is one first-failure log line: a dependency that fails, where, and why; or, with Err nil, one that
// answers again after failing.
type Failure struct {
	Dependency, Address string
	Err                 error
}

// failureLog decides the first-failure log lines: a dependency's failure is logged when first seen, then again
// at a bounded rate while it lasts (lograte.Schedule), and its recovery once. The broker and the pod source are
// logged only until they are first reached: after that their losses are the edge's normal life, which the
// journal and the offline policy are for. The runtime is logged whenever it fails.
type failureLog struct {
	schedules map[string]*lograte.Schedule
}

// next returns the lines due at r.Now.
func (f *failureLog) next(r Readiness) []Failure {
	if f.schedules == nil {
		f.schedules = map[string]*lograte.Schedule{}
	}
	var out []Failure
	check := func(dep, address string, failing bool, err error) {
		s := f.schedules[dep]
		switch {
		case failing && s == nil:
			s = &lograte.Schedule{}
			f.schedules[dep] = s
			fallthrough
		case failing:
			if s.Due(r.Now) {
				out = append(out, Failure{Dependency: dep, Address: address, Err: err})
			}
		case s != nil:
			delete(f.schedules, dep)
			out = append(out, Failure{Dependency: dep, Address: address})
		}
	}
	check(DepRuntime, r.Runtime.Address, r.Runtime.Err != nil, r.Runtime.Err)
	for _, s := range []SessionState{r.Broker, r.Pods} {
		check(s.Name, s.Address, !s.EverUp && s.Err != nil, s.Err)
	}
	return out
}

// Session is a dependency the agent keeps a session with, as a Monitor watches it.
type Session struct {
	Address string
	// Up tells whether it answers now.
	Up func() bool
	// Err is the latest failure seen (an agent.ErrorTap's); nil: none.
	Err func() error
}

// Monitor holds what the agent's probes answer and its first-failure log lines say: when its loops last turned,
// and what the runtime, the broker and the pod source have answered since it started. The agent's loop feeds it
// (LoopProbe), Heartbeats through a HeartbeatSender it wraps, and Run samples the sessions. Safe for concurrent
// use; configure it before its first use.
type Monitor struct {
	// RuntimeAddress is the CRI socket, as the probes and the logs name it.
	RuntimeAddress string
	// RuntimeFresh is how recently the runtime must have answered for the agent to be ready (RuntimeFreshness).
	RuntimeFresh time.Duration
	// Broker is the MQTT session; Pods the API server or MetaServer the node's pods are read from.
	Broker, Pods Session
	// Now is the clock (default time.Now).
	Now func() time.Time
	// HandingOver tells whether another agent pod asks for the node (nil: never). The pods share the node's
	// network, so the new pod's readiness probe reaches this agent until it gives way: it must not answer for it.
	HandingOver func() bool

	mu          sync.Mutex // guards the fields below
	loops       map[string]*LoopState
	loopOrder   []string
	runtimeLast time.Time
	runtimeErr  error
	brokerEver  bool
	podsEver    bool
}

func (h *Monitor) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Loop registers a loop of the given period, taken as just turned.
func (h *Monitor) Loop(name string, period time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loops == nil {
		h.loops = map[string]*LoopState{}
	}
	if _, ok := h.loops[name]; !ok {
		h.loopOrder = append(h.loopOrder, name)
	}
	h.loops[name] = &LoopState{Name: name, Last: h.now(), StallAfter: StallAfter(period)}
}

// Turned records a turn of the named loop; an unregistered loop is ignored.
func (h *Monitor) Turned(name string) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.loops[name]; l != nil {
		l.Last = now
	}
}

// RuntimeRead records the outcome of a read of the runtime.
func (h *Monitor) RuntimeRead(err error) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.runtimeErr = err
	if err == nil {
		h.runtimeLast = now
	}
}

// RuntimeAnswers tells whether the runtime's latest read succeeded: the agent sees the node's workers.
func (h *Monitor) RuntimeAnswers() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runtimeErr == nil && !h.runtimeLast.IsZero()
}

// LoopProbe hears what the probes judge the agent's loop by: agent.LoopProbe, which AgentLoop is.
type LoopProbe interface {
	// Turned: the loop made progress (it turned, or ended an action).
	Turned()
	// RuntimeRead: a read of the runtime ended; err is nil when the runtime answered.
	RuntimeRead(err error)
}

// HeartbeatSender is the session a heartbeat goes out on: agent.HeartbeatSender, which Heartbeats wraps.
type HeartbeatSender interface {
	PublishNow(topic string, payload []byte) bool
	BirthSeq() uint64
}

// AgentLoop is what the agent's loop tells the Monitor (agent.Config.Probe): its turns, and its reads of the runtime.
func (h *Monitor) AgentLoop() LoopProbe { return agentLoopProbe{h} }

type agentLoopProbe struct{ h *Monitor }

func (p agentLoopProbe) Turned()               { p.h.Turned(LoopAgent) }
func (p agentLoopProbe) RuntimeRead(err error) { p.h.RuntimeRead(err) }

// Heartbeats wraps s so that each heartbeat sent is a turn of the heartbeat loop.
func (h *Monitor) Heartbeats(s HeartbeatSender) HeartbeatSender {
	return heartbeatProbe{HeartbeatSender: s, h: h}
}

type heartbeatProbe struct {
	HeartbeatSender
	h *Monitor
}

func (p heartbeatProbe) PublishNow(topic string, payload []byte) bool {
	p.h.Turned(LoopHeartbeats)
	return p.HeartbeatSender.PublishNow(topic, payload)
}

// readiness samples the sessions and returns what the readiness policy reads now.
func (h *Monitor) readiness() Readiness {
	now := h.now()
	broker := sample(DepBroker, h.Broker)
	pods := sample(DepPods, h.Pods)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.brokerEver = h.brokerEver || broker.Up
	h.podsEver = h.podsEver || pods.Up
	broker.EverUp, pods.EverUp = h.brokerEver, h.podsEver
	return Readiness{Now: now, RuntimeFresh: h.RuntimeFresh, Broker: broker, Pods: pods,
		Runtime: RuntimeState{Address: h.RuntimeAddress, LastAnswer: h.runtimeLast, Err: h.runtimeErr}}
}

func sample(name string, s Session) SessionState {
	st := SessionState{Name: name, Address: s.Address}
	if s.Up != nil {
		st.Up = s.Up()
	}
	if s.Err != nil {
		st.Err = s.Err()
	}
	return st
}

// loopStates are the loops as the liveness policy reads them, in the order registered.
func (h *Monitor) loopStates() []LoopState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]LoopState, 0, len(h.loopOrder))
	for _, name := range h.loopOrder {
		out = append(out, *h.loops[name])
	}
	return out
}

// Handler serves /healthz (Alive: the loops turn) and /readyz (Ready: the dependencies answered), one line per
// check and a verdict, with 200 when all pass and 503 otherwise.
func (h *Monitor) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		ok, lines := Alive(h.now(), h.loopStates())
		write(w, ok, lines, "healthz")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if h.HandingOver != nil && h.HandingOver() {
			write(w, false, []string{"[-]node failed: another agent pod asks for it, and this one gives way"}, "readyz")
			return
		}
		ok, lines := Ready(h.readiness())
		write(w, ok, lines, "readyz")
	})
	return mux
}

func write(w http.ResponseWriter, ok bool, lines []string, what string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	verdict := what + " check passed"
	if !ok {
		verdict = what + " check failed"
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprint(w, strings.Join(append(lines, verdict), "\n")+"\n")
}

// Run samples the sessions every second, so that a session up for a moment still counts as reached, and logs
// each dependency's failure as failureLog says: an error naming the dependency, its address and why, at once and
// then at a bounded rate while it lasts, and one line when it answers again. It returns when ctx ends.
func (h *Monitor) Run(ctx context.Context, log logr.Logger) {
	var failures failureLog
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for _, f := range failures.next(h.readiness()) {
			if f.Err == nil {
				log.Info("dependency answers", "dependency", f.Dependency, "address", f.Address)
				continue
			}
			log.Error(f.Err, "dependency failing", "dependency", f.Dependency, "address", f.Address, "what", describe(f.Dependency))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// describe says in words what a dependency is, for the log.
func describe(dep string) string {
	switch dep {
	case DepRuntime:
		return "the container runtime (CRI socket): workers cannot be observed or restarted"
	case DepBroker:
		return "the MQTT broker: not reached since the agent started; what it must send is journaled"
	case DepPods:
		return "the API server or KubeEdge's MetaServer: not reached since the agent started; the node's workers are as last saved"
	}
	return dep
}
