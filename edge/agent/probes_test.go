package agent

import (
	"context"
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
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/health"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

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
// watcher, each behind a health.Monitor — on a node where nothing answers yet: its readiness names each
// dependency with its address and why it fails, each failure is logged once (not at every retry), and once they
// all answer it is ready, says so, and stays ready when the broker and the pod source go away again. The runtime
// going away makes it unready.
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
	// those of Monitor.Run, which could log a line at each.
	var looks atomic.Int64
	monitor := &health.Monitor{RuntimeAddress: socket, RuntimeFresh: time.Second,
		Broker: health.Session{Address: "tcp://" + brokerAddr, Up: pub.Connected, Err: func() error { looks.Add(1); return brokerErrors.Err() }},
		Pods:   health.Session{Address: "http://" + podsAddr, Up: workers.Reachable, Err: podsErrors.Err}}
	monitor.Loop(health.LoopAgent, 100*time.Millisecond)
	a, err := New(Config{Cluster: "c", Node: "edge-1", Source: runtime, Workers: workers, Publisher: pub, Store: j,
		APIReachable: workers.Reachable, BrokerUp: pub.Connected, Interval: 100 * time.Millisecond, Log: logr.Discard(),
		Probe: monitor.AgentLoop()})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedLines
	for _, run := range []func(){func() { pub.Run(ctx) }, func() { workers.Run(ctx, 100*time.Millisecond) }, func() { a.Run(ctx) },
		func() { monitor.Run(ctx, logs.logger()) }} {
		running.Go(run)
	}
	srv := httptest.NewServer(monitor.Handler())
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
	// healthTurns waits until Monitor.Run has sampled n more times: n-1 turns, with their log lines, done since.
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
