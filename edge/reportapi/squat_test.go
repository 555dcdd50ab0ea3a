package reportapi

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/internal/listen"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// freeLoopbackPort is a port free on both 127.0.0.1 and ::1 now; the test skips where the node has no IPv6
// loopback (no process can squat on it there).
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	for range 20 {
		v4, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(v4.Addr().(*net.TCPAddr).Port)
		v6, err := net.Listen("tcp", net.JoinHostPort("::1", port))
		v4.Close()
		if err == nil {
			v6.Close()
			return port
		}
		if probe, perr := net.Listen("tcp", "[::1]:0"); perr != nil {
			t.Skipf("no IPv6 loopback here: %v", perr)
		} else {
			probe.Close()
		}
	}
	t.Fatal("no port free on both loopbacks")
	return ""
}

func serveOn(t *testing.T, addr string) {
	t.Helper()
	s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { return nil }), workerSet{"default/sdd-trainworker-0": true},
		func() uint64 { return 1 }, 10, nil, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go s.Run(ctx)
	go func() { done <- s.ListenAndServe(ctx, addr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	})
}

// Workers post to http://localhost:9100, which resolves to ::1 first on Debian and RHEL-family nodes. The agent,
// told 127.0.0.1, holds ::1 too: a process of the node that tries to listen there to receive the workers' reports
// cannot, and a report posted to ::1 is the agent's.
func TestReportSquatterOnTheIPv6LoopbackGetsNoReport(t *testing.T) {
	port := freeLoopbackPort(t)
	serveOn(t, "127.0.0.1:"+port)
	testkit.Until(t, 10*time.Second, "the agent serving ::1", func() bool {
		c, err := net.Dial("tcp", "[::1]:"+port)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if squatter, err := net.Listen("tcp", "[::1]:"+port); err == nil {
		squatter.Close()
		t.Fatal("a squatter listens on [::1] beside the agent")
	}
	if code, _ := post(t, "http://[::1]:"+port, "sdd-trainworker-0", validBody); code != http.StatusOK {
		t.Errorf("a report posted to ::1: %d, want 200 from the agent", code)
	}
}

// A process holding the report port when the agent starts no longer crash-loops it: the agent keeps trying, and
// takes the port once the process lets it go.
func TestHeldReportPortIsTakenOnceFreedNotFatal(t *testing.T) {
	listen.Retry = 20 * time.Millisecond
	port := freeLoopbackPort(t)
	holder, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, "127.0.0.1:"+port)
	holder.Close()
	testkit.Until(t, 10*time.Second, "the freed port the agent's", func() bool {
		resp, err := http.Post("http://127.0.0.1:"+port+"/sedna/workers/sdd-trainworker-0/info", "application/json", nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode != 0
	})
	if code, _ := post(t, "http://127.0.0.1:"+port, "sdd-trainworker-0", validBody); code != http.StatusOK {
		t.Errorf("a report posted once the port was freed: %d, want 200", code)
	}
}
