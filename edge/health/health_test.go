package health

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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

// The probe handler answers 200 or 503 with one line per check, and /healthz fails once a loop stops turning.
func TestHealthHandler(t *testing.T) {
	now := t0
	h := &Monitor{Now: func() time.Time { return now }, RuntimeAddress: "/run/cri.sock", RuntimeFresh: 10 * time.Second,
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
