package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// The readiness policy: the runtime answered lately, the broker and the pod source were reached since start; a
// later loss of either is the edge's normal life and leaves the agent ready.
func TestReady(t *testing.T) {
	runtimeOK := RuntimeState{Address: "/run/cri.sock", LastAnswer: t0.Add(-time.Second)}
	reached := func(name string) SessionState {
		return SessionState{Name: name, Address: name + "-addr", EverUp: true, Up: true}
	}
	refused := errors.New("dial tcp 127.0.0.1:1883: connect: connection refused")
	tests := []struct {
		name      string
		in        Readiness
		wantReady bool
		wantLines []string
	}{{
		name:      "everything answers",
		in:        Readiness{Runtime: runtimeOK, Broker: reached(DepBroker), Pods: reached(DepPods)},
		wantReady: true,
		wantLines: []string{"[+]runtime ok: answered 1s ago (/run/cri.sock)", "[+]broker ok: reached (broker-addr)",
			"[+]api-server ok: reached (api-server-addr)"},
	}, {
		name: "just started: nothing has answered yet",
		in:   Readiness{Runtime: RuntimeState{Address: "/run/cri.sock"}, Broker: SessionState{Name: DepBroker, Address: "tcp://b:1883"}, Pods: SessionState{Name: DepPods, Address: "http://127.0.0.1:10550"}},
		wantLines: []string{
			"[-]runtime failed: no answer since the agent started (/run/cri.sock): no attempt has ended yet",
			"[-]broker failed: not reached since the agent started (tcp://b:1883): no attempt has ended yet",
			"[-]api-server failed: not reached since the agent started (http://127.0.0.1:10550): no attempt has ended yet"},
	}, {
		name: "the broker was never reached, and says why",
		in: Readiness{Runtime: runtimeOK, Pods: reached(DepPods),
			Broker: SessionState{Name: DepBroker, Address: "tcp://b:1883", Err: refused}},
		wantLines: []string{"[+]runtime ok: answered 1s ago (/run/cri.sock)",
			"[-]broker failed: not reached since the agent started (tcp://b:1883): dial tcp 127.0.0.1:1883: connect: connection refused",
			"[+]api-server ok: reached (api-server-addr)"},
	}, {
		name: "the broker and the API server lost after they were reached: still ready",
		in: Readiness{Runtime: runtimeOK, Broker: SessionState{Name: DepBroker, Address: "b", EverUp: true, Err: refused},
			Pods: SessionState{Name: DepPods, Address: "p", EverUp: true}},
		wantReady: true,
		wantLines: []string{"[+]runtime ok: answered 1s ago (/run/cri.sock)",
			"[+]broker ok: reached since the agent started, out of reach now (b): the edge's normal life, not a reason to be unready",
			"[+]api-server ok: reached since the agent started, out of reach now (p): the edge's normal life, not a reason to be unready"},
	}, {
		name: "the runtime's last answer is too old",
		in: Readiness{Runtime: RuntimeState{Address: "/run/cri.sock", LastAnswer: t0.Add(-30 * time.Second), Err: errors.New("deadline exceeded")},
			Broker: reached(DepBroker), Pods: reached(DepPods)},
		wantLines: []string{"[-]runtime failed: last answer 30s ago, more than 10s (/run/cri.sock): deadline exceeded",
			"[+]broker ok: reached (broker-addr)", "[+]api-server ok: reached (api-server-addr)"},
	}, {
		name:      "the runtime's last answer exactly at the limit",
		in:        Readiness{Runtime: RuntimeState{Address: "s", LastAnswer: t0.Add(-10 * time.Second)}, Broker: reached(DepBroker), Pods: reached(DepPods)},
		wantReady: true,
		wantLines: []string{"[+]runtime ok: answered 10s ago (s)", "[+]broker ok: reached (broker-addr)", "[+]api-server ok: reached (api-server-addr)"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Now, tt.in.RuntimeFresh = t0, 10*time.Second
			ready, lines := Ready(tt.in)
			if ready != tt.wantReady {
				t.Errorf("ready = %v, want %v", ready, tt.wantReady)
			}
			if diff := cmp.Diff(tt.wantLines, lines); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

// The liveness policy: a loop is wedged once it has not turned for its StallAfter.
func TestAlive(t *testing.T) {
	tests := []struct {
		name      string
		loops     []LoopState
		wantAlive bool
		wantLines []string
	}{
		{name: "no loop", wantAlive: true, wantLines: []string{}},
		{name: "every loop turned lately", wantAlive: true,
			loops: []LoopState{{Name: LoopAgent, Last: t0.Add(-300 * time.Millisecond), StallAfter: StallAfter(500 * time.Millisecond)},
				{Name: LoopHeartbeats, Last: t0.Add(-time.Second), StallAfter: StallAfter(time.Second)}},
			wantLines: []string{"[+]agent ok: turned 300ms ago", "[+]heartbeats ok: turned 1s ago"}},
		{name: "one loop wedged",
			loops: []LoopState{{Name: LoopAgent, Last: t0.Add(-3 * time.Minute), StallAfter: 2 * time.Minute},
				{Name: LoopHeartbeats, Last: t0, StallAfter: 2 * time.Minute}},
			wantLines: []string{"[-]agent failed: no turn for 3m0s (wedged after 2m0s)", "[+]heartbeats ok: turned 0s ago"}},
		{name: "at the limit is not wedged", wantAlive: true,
			loops:     []LoopState{{Name: LoopAgent, Last: t0.Add(-2 * time.Minute), StallAfter: 2 * time.Minute}},
			wantLines: []string{"[+]agent ok: turned 2m0s ago"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			alive, lines := Alive(t0, tt.loops)
			if alive != tt.wantAlive {
				t.Errorf("alive = %v, want %v", alive, tt.wantAlive)
			}
			if diff := cmp.Diff(tt.wantLines, lines); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStallAfterAndRuntimeFreshness(t *testing.T) {
	for _, tt := range []struct {
		period, stall, fresh time.Duration
	}{
		{500 * time.Millisecond, 2 * time.Minute, 10 * time.Second},
		{30 * time.Second, 5 * time.Minute, 2 * time.Minute},
	} {
		if got := StallAfter(tt.period); got != tt.stall {
			t.Errorf("StallAfter(%s) = %s, want %s", tt.period, got, tt.stall)
		}
		if got := RuntimeFreshness(tt.period); got != tt.fresh {
			t.Errorf("RuntimeFreshness(%s) = %s, want %s", tt.period, got, tt.fresh)
		}
	}
}

// The first-failure lines, as a script over time: each failing dependency is logged at once, then after a
// minute, then at doubling gaps up to ten minutes; its recovery once; the broker and the pod source only until
// first reached.
func TestFailureLog(t *testing.T) {
	refused := errors.New("connection refused")
	missing := errors.New("dial unix /run/cri.sock: connect: no such file or directory")
	type step struct {
		at      time.Duration
		runtime error // the runtime's latest read; nil: it answered
		broker  SessionState
		want    []string // "dependency: error" or "dependency: answers"
	}
	brokerDown := SessionState{Name: DepBroker, Address: "b", Err: refused}
	brokerUp := SessionState{Name: DepBroker, Address: "b", EverUp: true, Up: true, Err: refused}
	brokerLost := SessionState{Name: DepBroker, Address: "b", EverUp: true, Err: refused}
	steps := []step{
		{at: 0, runtime: missing, broker: brokerDown, want: []string{"runtime: " + missing.Error(), "broker: connection refused"}},
		{at: time.Second, runtime: missing, broker: brokerDown},
		{at: 59 * time.Second, runtime: missing, broker: brokerDown},
		{at: time.Minute, runtime: missing, broker: brokerDown, want: []string{"runtime: " + missing.Error(), "broker: connection refused"}},
		{at: 2 * time.Minute, runtime: missing, broker: brokerDown},
		{at: 3 * time.Minute, runtime: missing, broker: brokerDown, want: []string{"runtime: " + missing.Error(), "broker: connection refused"}},
		{at: 3*time.Minute + time.Second, runtime: nil, broker: brokerDown, want: []string{"runtime: answers"}},
		{at: 4 * time.Minute, runtime: nil, broker: brokerUp, want: []string{"broker: answers"}},
		// Lost after it was reached: the edge's normal life, never logged as a failure.
		{at: 5 * time.Minute, runtime: nil, broker: brokerLost},
		{at: 60 * time.Minute, runtime: nil, broker: brokerLost},
		// The runtime failing again is logged again, at once.
		{at: 61 * time.Minute, runtime: missing, broker: brokerLost, want: []string{"runtime: " + missing.Error()}},
	}
	var f failureLog
	for _, s := range steps {
		got := []string{}
		for _, l := range f.next(Readiness{Now: t0.Add(s.at), Runtime: RuntimeState{Address: "/run/cri.sock", Err: s.runtime},
			Broker: s.broker, Pods: SessionState{Name: DepPods, Address: "p", EverUp: true}}) {
			if l.Err == nil {
				got = append(got, l.Dependency+": answers")
			} else {
				got = append(got, l.Dependency+": "+l.Err.Error())
			}
		}
		want := s.want
		if want == nil {
			want = []string{}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("at %s (-want +got):\n%s", s.at, diff)
		}
	}
}

// The tap keeps the latest error a component logs, at any verbosity, and passes on only what the logger it
// wraps would have written.
func TestErrorTap(t *testing.T) {
	var written []string
	base := funcr.New(func(prefix, args string) { written = append(written, prefix+" "+args) }, funcr.Options{Verbosity: 0})
	var tap ErrorTap
	log := tap.Logger(base).WithName("publisher").WithValues("k", "v")
	if tap.Err() != nil {
		t.Fatalf("a new tap holds %v", tap.Err())
	}
	log.V(2).Info("broker unreachable", "broker", "tcp://b:1883", "error", "dial tcp: connection refused")
	if got := fmt.Sprint(tap.Err()); got != "dial tcp: connection refused" {
		t.Errorf("after a -v=2 line: %q", got)
	}
	if len(written) != 0 {
		t.Errorf("a -v=2 line was written at verbosity 0: %q", written)
	}
	log.Info("connected", "birthSeq", 3)
	if got := fmt.Sprint(tap.Err()); got != "dial tcp: connection refused" {
		t.Errorf("a line without an error changed it: %q", got)
	}
	log.Error(errors.New("not Authorized"), "login")
	if got := fmt.Sprint(tap.Err()); got != "not Authorized" {
		t.Errorf("after Error: %q", got)
	}
	if len(written) != 2 || !strings.Contains(written[1], `"msg"="login"`) || !strings.HasPrefix(written[1], "publisher ") {
		t.Errorf("written: %q", written)
	}
	var discard ErrorTap
	discard.Logger(logr.Discard()).V(4).Info("x", "err", errors.New("gone"))
	if got := fmt.Sprint(discard.Err()); got != "gone" {
		t.Errorf("behind a discarding logger: %q", got)
	}
}

// The probe handler answers 200 or 503 with one line per check, and /healthz fails once a loop stops turning.
func TestHealthHandler(t *testing.T) {
	now := t0
	h := &Health{Now: func() time.Time { return now }, RuntimeAddress: "/run/cri.sock", RuntimeFresh: 10 * time.Second,
		Broker: Session{Address: "tcp://b:1883", Up: func() bool { return true }},
		Pods:   Session{Address: "http://127.0.0.1:10550", Up: func() bool { return false }, Err: func() error { return errors.New("connection refused") }}}
	h.Loop(LoopAgent, 500*time.Millisecond)
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	h.AgentLoop().RuntimeRead(nil)
	steps := []struct {
		name       string
		do         func()
		path       string
		wantStatus int
		wantBody   string
	}{
		{name: "healthy at start", path: "/healthz", wantStatus: 200, wantBody: "[+]agent ok: turned 0s ago\nhealthz check passed\n"},
		{name: "unready: the pod source never answered", path: "/readyz", wantStatus: 503,
			wantBody: "[+]runtime ok: answered 0s ago (/run/cri.sock)\n[+]broker ok: reached (tcp://b:1883)\n" +
				"[-]api-server failed: not reached since the agent started (http://127.0.0.1:10550): connection refused\nreadyz check failed\n"},
		{name: "ready once it answered", do: func() { h.Pods.Up = func() bool { return true } }, path: "/readyz", wantStatus: 200,
			wantBody: "[+]runtime ok: answered 0s ago (/run/cri.sock)\n[+]broker ok: reached (tcp://b:1883)\n" +
				"[+]api-server ok: reached (http://127.0.0.1:10550)\nreadyz check passed\n"},
		{name: "still ready when it is lost", do: func() { h.Pods.Up = func() bool { return false } }, path: "/readyz", wantStatus: 200,
			wantBody: "[+]runtime ok: answered 0s ago (/run/cri.sock)\n[+]broker ok: reached (tcp://b:1883)\n" +
				"[+]api-server ok: reached since the agent started, out of reach now (http://127.0.0.1:10550): the edge's normal life, not a reason to be unready\nreadyz check passed\n"},
		{name: "not ready for another agent pod that asks for the node: its probe reaches this agent", do: func() { h.HandingOver = func() bool { return true } },
			path: "/readyz", wantStatus: 503, wantBody: "[-]node failed: another agent pod asks for it, and this one gives way\nreadyz check failed\n"},
		{name: "still alive meanwhile", path: "/healthz", wantStatus: 200, wantBody: "[+]agent ok: turned 0s ago\nhealthz check passed\n"},
		{name: "the loop turns an action later", do: func() { h.HandingOver = nil; now = now.Add(90 * time.Second); h.AgentLoop().Turned() }, path: "/healthz",
			wantStatus: 200, wantBody: "[+]agent ok: turned 0s ago\nhealthz check passed\n"},
		{name: "wedged: no turn for longer than its stall limit", do: func() { now = now.Add(2*time.Minute + time.Second) }, path: "/healthz",
			wantStatus: 503, wantBody: "[-]agent failed: no turn for 2m1s (wedged after 2m0s)\nhealthz check failed\n"},
		{name: "and the runtime's answer is stale by now", path: "/readyz", wantStatus: 503,
			wantBody: "[-]runtime failed: last answer 3m31s ago, more than 10s (/run/cri.sock): no attempt has ended yet\n[+]broker ok: reached (tcp://b:1883)\n" +
				"[+]api-server ok: reached since the agent started, out of reach now (http://127.0.0.1:10550): the edge's normal life, not a reason to be unready\nreadyz check failed\n"},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		status, body := get(s.path)
		if status != s.wantStatus {
			t.Errorf("%s: %s answered %d, want %d", s.name, s.path, status, s.wantStatus)
		}
		if diff := cmp.Diff(s.wantBody, body); diff != "" {
			t.Errorf("%s: %s body (-want +got):\n%s", s.name, s.path, diff)
		}
	}
	resp, err := http.Post(srv.URL+"/readyz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /readyz: %d, want 405", resp.StatusCode)
	}
}

// lockedLines collects a logger's lines while the test reads them.
type lockedLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

// count is how many lines hold every one of parts.
func (l *lockedLines) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// podSource stands in for the MetaServer at addr: it lists no pod and holds each watch open.
func startPodSource(t *testing.T, addr string) *http.Server {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, `{"metadata":{"resourceVersion":"1"},"items":[]}`)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return srv
}

// startBroker runs an embedded broker that lets everyone in, at addr, until the test ends or the returned
// function stops it.
func startBroker(t *testing.T, addr string) (stop func()) {
	t.Helper()
	server := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})); err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve() }()
	var once sync.Once
	stop = func() { once.Do(func() { server.Close() }) }
	t.Cleanup(stop)
	return stop
}

// An agent wired as cmd/lifeline-agent wires it — its loop reading a CRI socket, its MQTT session, its pod
// watcher, each behind Health — on a node where nothing answers yet: its readiness names each dependency with
// its address and why it fails, each failure is logged once (not at every retry), and once they all answer it
// is ready, says so, and stays ready when the broker and the pod source go away again. The runtime going away
// makes it unready.
func TestProbesOfAnAgentWhoseDependenciesComeLate(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "cri.sock") // where simnode.StartCRI serves
	brokerAddr, podsAddr := harness.FreeAddr(t), harness.FreeAddr(t)
	runtime, err := cri.Dial(socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close()
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	// Before the journal closes and the state directory goes: the loops write into both.
	t.Cleanup(func() { cancel(); running.Wait() })

	var podsErrors, brokerErrors ErrorTap
	workers, err := desired.New(desired.NewPodClient("http://"+podsAddr, nil, ""), "edge-1", dir, podsErrors.Logger(logr.Discard()))
	if err != nil {
		t.Fatal(err)
	}
	pub := publisher.New(publisher.Config{Broker: "tcp://" + brokerAddr, Cluster: "c", Node: "edge-1", StateDir: dir,
		RetryInterval: 50 * time.Millisecond, MaxRetryInterval: 200 * time.Millisecond, Log: brokerErrors.Logger(logr.Discard())}, j)
	// looks counts the times readiness is sampled, each reading the broker's error once: with no probe asked,
	// those of Health.Run, which could log a line at each.
	var looks atomic.Int64
	health := &Health{RuntimeAddress: socket, RuntimeFresh: time.Second,
		Broker: Session{Address: "tcp://" + brokerAddr, Up: pub.Connected, Err: func() error { looks.Add(1); return brokerErrors.Err() }},
		Pods:   Session{Address: "http://" + podsAddr, Up: workers.Reachable, Err: podsErrors.Err}}
	health.Loop(LoopAgent, 100*time.Millisecond)
	a, err := New(Config{Cluster: "c", Node: "edge-1", Source: runtime, Workers: workers, Publisher: pub, Store: j,
		APIReachable: workers.Reachable, BrokerUp: pub.Connected, Interval: 100 * time.Millisecond, Log: logr.Discard(),
		Probe: health.AgentLoop()})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedLines
	for _, run := range []func(){func() { pub.Run(ctx) }, func() { workers.Run(ctx, 100*time.Millisecond) }, func() { a.Run(ctx) },
		func() { health.Run(ctx, logs.logger()) }} {
		running.Go(run)
	}
	srv := httptest.NewServer(health.Handler())
	defer srv.Close()
	probe := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// healthTurns waits until Health.Run has sampled n more times: n-1 turns, with their log lines, done since.
	healthTurns := func(t *testing.T, n int64) {
		t.Helper()
		until := looks.Load() + n
		testkit.Until(t, 10*time.Second, fmt.Sprintf("%d turns of the health loop", n), func() bool { return looks.Load() >= until })
	}
	eventually := func(t *testing.T, what string, cond func() (bool, string)) {
		t.Helper()
		testkit.UntilErr(t, 10*time.Second, what, testkit.Why(cond))
	}
	readyz := func(wantStatus int, wantLines ...string) func() (bool, string) {
		return func() (bool, string) {
			status, body := probe("/readyz")
			ok := status == wantStatus
			for _, l := range wantLines {
				ok = ok && strings.Contains(body, l)
			}
			return ok, fmt.Sprintf("%d %q", status, body)
		}
	}
	var rt *simnode.CRI
	var stopBroker func()
	var pods *http.Server
	steps := []struct {
		name  string
		do    func(t *testing.T)
		holds func(t *testing.T)
	}{{
		name: "nothing answers",
		holds: func(t *testing.T) {
			eventually(t, "unready, naming each dependency, its address and why", readyz(http.StatusServiceUnavailable,
				"[-]runtime failed: no answer since the agent started ("+socket+"): ", "no such file or directory",
				"[-]broker failed: not reached since the agent started (tcp://"+brokerAddr+"): ", "connection refused",
				"[-]api-server failed: not reached since the agent started (http://"+podsAddr+"): "))
			eventually(t, "a first-failure line for each", func() (bool, string) {
				n := []int{logs.count(`"msg"="dependency failing"`, `"dependency"="runtime"`, socket, "no such file or directory"),
					logs.count(`"msg"="dependency failing"`, `"dependency"="broker"`, brokerAddr, "connection refused"),
					logs.count(`"msg"="dependency failing"`, `"dependency"="api-server"`, podsAddr, "connection refused")}
				return n[0] == 1 && n[1] == 1 && n[2] == 1, fmt.Sprintf("lines per dependency %v", n)
			})
			if status, body := probe("/healthz"); status != http.StatusOK {
				t.Errorf("/healthz: %d %q, want 200", status, body)
			}
		},
	}, {
		name: "they keep failing for a few seconds",
		do:   func(t *testing.T) { healthTurns(t, 3) },
		holds: func(t *testing.T) {
			if n := logs.count(`"msg"="dependency failing"`); n != 3 {
				t.Errorf("%d failure lines after a few seconds of retries, want the first 3 only", n)
			}
		},
	}, {
		name: "the runtime, the broker and the pod source come up",
		do: func(t *testing.T) {
			if rt, err = simnode.StartCRI(dir); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.Stop)
			stopBroker = startBroker(t, brokerAddr)
			pods = startPodSource(t, podsAddr)
		},
		holds: func(t *testing.T) {
			eventually(t, "ready", readyz(http.StatusOK, "[+]runtime ok", "[+]broker ok: reached", "[+]api-server ok: reached"))
			eventually(t, "each recovery logged once", func() (bool, string) {
				n := logs.count(`"msg"="dependency answers"`)
				return n == 3, fmt.Sprintf("%d recovery lines", n)
			})
		},
	}, {
		name: "the broker and the pod source go away",
		do: func(*testing.T) {
			stopBroker()
			pods.Close()
		},
		holds: func(t *testing.T) {
			eventually(t, "both seen out of reach", func() (bool, string) { return !pub.Connected() && !workers.Reachable(), "" })
			healthTurns(t, 2)
			if ok, why := readyz(http.StatusOK, "[+]broker ok: reached since the agent started, out of reach now",
				"[+]api-server ok: reached since the agent started, out of reach now")(); !ok {
				t.Errorf("after losing the broker and the pod source: %s, want still ready", why)
			}
			if n := logs.count(`"msg"="dependency failing"`); n != 3 {
				t.Errorf("%d failure lines, want no new one for the edge's normal life", n)
			}
		},
	}, {
		name: "the runtime goes away",
		do:   func(*testing.T) { rt.Stop() },
		holds: func(t *testing.T) {
			eventually(t, "unready", readyz(http.StatusServiceUnavailable, "[-]runtime failed: last answer"))
			eventually(t, "its failure logged again", func() (bool, string) {
				n := logs.count(`"msg"="dependency failing"`, `"dependency"="runtime"`)
				return n == 2, fmt.Sprintf("%d runtime failure lines", n)
			})
			if status, body := probe("/healthz"); status != http.StatusOK {
				t.Errorf("/healthz: %d %q, want 200: the loop still turns", status, body)
			}
		},
	}}
	for _, s := range steps {
		t.Logf("step: %s", s.name)
		if s.do != nil {
			s.do(t)
		}
		s.holds(t)
	}
}
