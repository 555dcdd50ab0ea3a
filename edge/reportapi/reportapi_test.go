package reportapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// validBody is what Sedna's trainer sends.
const validBody = `{"name":"sdd-trainworker-0","namespace":"default","ownerName":"sdd","ownerKind":"default",
"kind":"train","status":"running","results":[{"format":"pb","url":"/home/data/model/model.pb","metrics":{"loss":0.25}}],
"ownerInfo":{"currentRound":3,"sampleCount":120,"startTime":"2026-12-01 10:00:00","updateTime":"2026-12-01 10:00:09"}}`

func post(t *testing.T, url, name, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/sedna/workers/"+name+"/info", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reply map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&reply)
	return resp.StatusCode, reply
}

func TestReportAPI(t *testing.T) {
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	s := New("c", "edge-1", sinkFunc(func(e journal.Entry) error { _, err := j.Put(e); return err }),
		workerSet{"default/sdd-trainworker-0": true}, func() uint64 { return 7 }, 10, nil, logr.Discard())
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)

	cases := []struct {
		name, path, body string
		wantCode         int
		wantMessage      string
		outcome          string
	}{
		{"valid", "sdd-trainworker-0", validBody, 200, "OK", "queued"},
		{"name differs from the path", "sdd-trainworker-1", validBody, 400, `report for "sdd-trainworker-0" posted to the path of "sdd-trainworker-1"`, "rejected_name_mismatch"},
		{"garbage", "w", "\x00\xffnot json", 400, "is not the worker report JSON", "rejected_malformed"},
		{"bad namespace", "w", `{"name":"w","namespace":"../etc"}`, 400, "namespace:", "rejected_malformed"},
		{"not a worker of this node", "other", `{"name":"other","namespace":"default"}`, 403, "default/other is not a worker of this node", "rejected_not_a_worker"},
		{"a worker's name in another namespace", "sdd-trainworker-0", `{"name":"sdd-trainworker-0","namespace":"team-b"}`, 403, "not a worker", "rejected_not_a_worker"},
		{"too large", "w", `{"name":"w","namespace":"d","results":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, 413, "over", "rejected_too_large"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(s.received.WithLabelValues(tc.outcome))
			code, reply := post(t, srv.URL, tc.path, tc.body)
			if code != tc.wantCode || !strings.Contains(reply["message"].(string), tc.wantMessage) || int(reply["status"].(float64)) != code {
				t.Errorf("reply %d %v, want %d with %q", code, reply, tc.wantCode, tc.wantMessage)
			}
			if after := testutil.ToFloat64(s.received.WithLabelValues(tc.outcome)); after != before+1 {
				t.Errorf("counter %s went %v -> %v", tc.outcome, before, after)
			}
		})
	}
	// The valid report reaches the journal as a WorkerReport on the node's reports topic.
	var pending []journal.Entry
	for i := 0; i < 500 && len(pending) == 0; i++ { // up to 5 s: bbolt syncs every commit
		pending, _ = j.Pending()
		if len(pending) == 0 {
			waitABit()
		}
	}
	if len(pending) != 1 || pending[0].Topic != "lifeline/v1/c/nodes/edge-1/reports" || pending[0].QoS != 1 {
		t.Fatalf("journal %+v, want the report", pending)
	}
	rep := &lifelinev1.WorkerReport{}
	if err := proto.Unmarshal(pending[0].Payload, rep); err != nil {
		t.Fatal(err)
	}
	if rep.Worker != "sdd-trainworker-0" || rep.Namespace != "default" || rep.Seq != 1 || rep.BirthSeq != 7 || string(rep.Body) != validBody {
		t.Errorf("report %+v", rep)
	}
}

// [P-REP-1] Whatever the path and the body, the handler never panics, answers in Sedna's reply shape, and
// queues a report only for one of the node's desired workers, under the name in its path; everything else is
// refused and counted.
func FuzzReportHandler(f *testing.F) {
	f.Add("sdd-trainworker-0", validBody)
	f.Add("other", `{"name":"other","namespace":"default"}`)
	f.Add("sdd-trainworker-0", `{"name":"sdd-trainworker-0","namespace":"kube-system"}`)
	f.Add("..%2f..%2fetc", `{"name":"../../etc","namespace":"default"}`)
	f.Add("w", "\x00\xff")
	f.Add("sdd-trainworker-0", `{"name":"sdd-trainworker-0","namespace":"default","name":"other"}`)
	workers := workerSet{"default/sdd-trainworker-0": true}
	f.Fuzz(func(t *testing.T, name, body string) {
		queued := make(chan *lifelinev1.WorkerReport, 1)
		s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { return nil }), workers, func() uint64 { return 1 }, 1, nil, logr.Discard())
		s.queue = queued
		req := httptest.NewRequest(http.MethodPost, "/sedna/workers/x/info", strings.NewReader(body))
		req.URL.Path = "/sedna/workers/" + name + "/info"
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		select {
		case rep := <-queued:
			if rec.Code != http.StatusOK || !workers.HasWorker(rep.Namespace, rep.Worker) || rep.Worker != name {
				t.Fatalf("queued a report for %s/%s posted to %q, answered %d", rep.Namespace, rep.Worker, name, rec.Code)
			}
		default:
			if rec.Code == http.StatusOK {
				t.Fatalf("answered 200 to %q without queuing", name)
			}
		}
	})
}

// A flood never blocks a worker and never grows memory past the queue: what does not fit is dropped and
// counted.
func TestFloodIsBoundedAndCounted(t *testing.T) {
	blocked := make(chan struct{})
	s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { <-blocked; return nil }), workerSet{"default/sdd-trainworker-0": true},
		func() uint64 { return 1 }, 16, nil, logr.Discard())
	s.ReportRate = 0 // one worker's reports, all of them: the queue's bound is what is tested
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	defer close(blocked)

	const floods = 500
	var wg sync.WaitGroup
	codes := make(chan int, floods)
	for i := 0; i < floods; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := post(t, srv.URL, "sdd-trainworker-0", validBody)
			codes <- code
		}()
	}
	wg.Wait()
	close(codes)
	counts := map[int]int{}
	for c := range codes {
		counts[c]++
	}
	queued := testutil.ToFloat64(s.received.WithLabelValues("queued"))
	dropped := testutil.ToFloat64(s.received.WithLabelValues("dropped"))
	// The consumer holds one report in the blocked sink; the queue holds 16.
	if queued > 17 || queued+dropped != floods || counts[503] != int(dropped) || counts[200] != int(queued) {
		t.Errorf("queued %v dropped %v replies %v", queued, dropped, counts)
	}
	if len(s.queue) > cap(s.queue) {
		t.Errorf("queue grew past its bound")
	}
}

// workerSet is a node's desired workers, by namespace/name.
type workerSet map[string]bool

func (w workerSet) HasWorker(namespace, name string) bool { return w[namespace+"/"+name] }

type sinkFunc func(journal.Entry) error

func (f sinkFunc) Enqueue(e journal.Entry) error { return f(e) }

func waitABit() { <-time.After(10 * time.Millisecond) }

// lcStandIn is an HTTP server in the place of Sedna's local controller: it records what it is posted, answers
// as LC does, and can be made to hang.
type lcStandIn struct {
	mu       sync.Mutex
	received []string      // "<path> <body>"
	hang     chan struct{} // while set, requests wait for it to close
}

func (lc *lcStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lc.mu.Lock()
	hang := lc.hang
	lc.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	body, _ := io.ReadAll(r.Body)
	lc.mu.Lock()
	lc.received = append(lc.received, r.URL.Path+" "+string(body))
	lc.mu.Unlock()
	writeReply(w, http.StatusOK, "OK")
}

func (lc *lcStandIn) got() []string {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return append([]string(nil), lc.received...)
}

// Reports of workers that are not the node's (a Sedna installation's incremental learning worker, a name the
// agent never heard of) reach Sedna's local controller as they were posted, on the same path; the node's own
// workers' reports do not; every forward is counted, and one that cannot get through is dropped after a bound.
func TestUnownedReportsAreForwardedToSednasLC(t *testing.T) {
	lc := &lcStandIn{}
	lcSrv := httptest.NewServer(lc)
	defer lcSrv.Close()
	var journaled sync.WaitGroup
	journaled.Add(1)
	s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { journaled.Done(); return nil }),
		workerSet{"default/sdd-trainworker-0": true}, func() uint64 { return 1 }, 4, nil, logr.Discard())
	s.ForwardUnowned(lcSrv.URL+"/", 4)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)

	il := `{"name":"il-train-1","namespace":"sedna","ownerName":"helmet-il","ownerKind":"incrementallearningjob","kind":"train","status":"running","results":[]}`
	stranger := `{"name":"who","namespace":"default","ownerName":"sedna","ownerKind":"default","kind":"eval"}`
	for _, r := range []struct{ name, body string }{{"il-train-1", il}, {"sdd-trainworker-0", validBody}, {"who", stranger}} {
		if code, reply := post(t, srv.URL, r.name, r.body); code != 200 || reply["message"] != "OK" {
			t.Errorf("%s: reply %d %v, want Sedna's OK", r.name, code, reply)
		}
	}
	journaled.Wait()
	want := []string{"/sedna/workers/il-train-1/info " + il, "/sedna/workers/who/info " + stranger}
	for i := 0; i < 500 && (len(lc.got()) < len(want) || testutil.ToFloat64(s.forwarded.WithLabelValues("sent")) < 2); i++ {
		waitABit() // the count follows LC's answer
	}
	if got := lc.got(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("LC received\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := testutil.ToFloat64(s.forwarded.WithLabelValues("sent")); n != 2 {
		t.Errorf("%v forwarded reports counted sent, want 2", n)
	}
	if n := testutil.ToFloat64(s.received.WithLabelValues("forwarding")); n != 2 {
		t.Errorf("%v reports counted forwarding, want 2", n)
	}

	// An LC that hangs: the worker is answered at once all the same, each post gives up after ForwardTimeout, and
	// what does not fit the queue meanwhile is refused and counted.
	hang := make(chan struct{})
	defer close(hang)
	lc.mu.Lock()
	lc.hang = hang
	lc.mu.Unlock()
	start := time.Now()
	codes := map[int]int{}
	for range 8 {
		code, _ := post(t, srv.URL, "who", stranger)
		codes[code]++
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("8 reports took %v to answer with LC hanging", elapsed)
	}
	// One post in flight, 4 queued, the rest refused.
	if codes[200] < 4 || codes[200] > 5 || codes[200]+codes[503] != 8 ||
		testutil.ToFloat64(s.received.WithLabelValues("forward_dropped")) != float64(codes[503]) {
		t.Errorf("replies %v with LC hanging, want the queue's 4 (or 5) accepted and the rest refused", codes)
	}
	deadline := time.Now().Add(ForwardTimeout + 2*time.Second)
	for testutil.ToFloat64(s.forwarded.WithLabelValues("failed")) < 1 && time.Now().Before(deadline) {
		waitABit()
	}
	if n := testutil.ToFloat64(s.forwarded.WithLabelValues("failed")); n < 1 {
		t.Errorf("no forward counted failed within %v of LC hanging", ForwardTimeout+2*time.Second)
	}
}

// serve serves s on a loopback listener the test made, wrapped by wrap (nil: as it is), until the test ends.
func serve(t *testing.T, s *Server, wrap func(net.Listener) net.Listener) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if wrap != nil {
		ln = wrap(ln)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr
}

// rawReport is a worker's report as it goes on the wire, with extra headers.
func rawReport(name, body, extraHeaders string) string {
	return fmt.Sprintf("POST /sedna/workers/%s/info HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s",
		name, len(body), extraHeaders, body)
}

// An attacker's request with a MiB of headers is refused as soon as its headers pass the bound, without the agent
// holding them, and the endpoint goes on taking the workers' reports.
func TestHugeHeadersAreRefusedAndReportsStillTaken(t *testing.T) {
	s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { return nil }), workerSet{"default/sdd-trainworker-0": true},
		func() uint64 { return 1 }, 10, nil, logr.Discard())
	addr := serve(t, s, nil)
	for _, c := range []struct {
		name, headers string
		wantCode      int
	}{
		{"a MiB of headers, just under the standard library's default bound", "X-Pad: " + strings.Repeat("a", 1000<<10) + "\r\n", 431},
		{"headers a little over the bound", "X-Pad: " + strings.Repeat("a", 2*MaxHeaderBytes) + "\r\n", 431},
		{"Sedna's worker's headers", "User-Agent: python-requests/2.28.1\r\nAccept: */*\r\n", 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			go func() { _, _ = io.WriteString(conn, rawReport("sdd-trainworker-0", validBody, c.headers)) }()
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound for a broken server, not a measure
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.wantCode {
				t.Errorf("answered %s, want %d", resp.Status, c.wantCode)
			}
		})
	}
}

// countingListener counts the connections its listener has open at once, and the most it ever had.
type countingListener struct {
	net.Listener
	mu             sync.Mutex
	open, most, in int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.open++
	l.in++
	l.most = max(l.most, l.open)
	l.mu.Unlock()
	return &countedConn{Conn: c, l: l}, nil
}

func (l *countingListener) counts() (open, most, accepted int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.most, l.in
}

type countedConn struct {
	net.Conn
	once sync.Once
	l    *countingListener
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.mu.Lock(); c.l.open--; c.l.mu.Unlock() })
	return c.Conn.Close()
}

// Item 7 of the third hardening round: connections that never finish their request (each could carry up to
// MaxHeaderBytes) held every place of the report API, and a worker's report waited until they timed out (0 of 40
// answered under 400 of them). They still take at most MaxConnections of the agent, but a new connection takes the
// place of the oldest that is not being answered: the worker's report is answered while they are all open, whether
// they stall in their headers or in their bodies, or wait idle after an answer.
func TestStalledConnectionsDoNotStarveAWorkersReport(t *testing.T) {
	const limit, beyond = 4, 12
	for _, stall := range []struct {
		name  string
		write func(c net.Conn) error
	}{
		{"in the headers", func(c net.Conn) error {
			_, err := io.WriteString(c, "POST /sedna/workers/sdd-trainworker-0/info HTTP/1.1\r\nHost: localhost\r\nX-Pad: ")
			return err
		}},
		{"in the body", func(c net.Conn) error {
			_, err := io.WriteString(c, "POST /sedna/workers/sdd-trainworker-0/info HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n")
			return err
		}},
		{"idle after an answer", func(c net.Conn) error {
			if _, err := io.WriteString(c, rawReport("sdd-trainworker-0", validBody, "")); err != nil {
				return err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}},
	} {
		t.Run(stall.name, func(t *testing.T) {
			s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { return nil }), workerSet{"default/sdd-trainworker-0": true},
				func() uint64 { return 1 }, 2*(limit+beyond), nil, logr.Discard())
			s.ReportRate = 0
			s.MaxConnections = limit
			counting := &countingListener{}
			addr := serve(t, s, func(ln net.Listener) net.Listener { counting.Listener = ln; return counting })
			var stalled []net.Conn
			defer func() {
				for _, c := range stalled {
					c.Close()
				}
			}()
			for range limit + beyond {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				stalled = append(stalled, c)
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if err := stall.write(c); err != nil {
					t.Fatal(err)
				}
			}
			testkit.Until(t, 5*time.Second, "the server taking every stalled connection", func() bool {
				_, _, accepted := counting.counts()
				return accepted >= limit+beyond
			})

			report, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer report.Close()
			if _, err := io.WriteString(report, rawReport("sdd-trainworker-0", validBody, "")); err != nil {
				t.Fatal(err)
			}
			// Well within the stalled connections' timeouts, which were what freed a place before.
			_ = report.SetReadDeadline(time.Now().Add(readHeaderTimeout / 2))
			resp, err := http.ReadResponse(bufio.NewReader(report), nil)
			if err != nil {
				t.Fatalf("no answer to a worker's report beside %d stalled connections: %v", limit+beyond, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("answered %s, want 200", resp.Status)
			}
			if open, most, _ := counting.counts(); most > limit+1 || open > limit {
				t.Errorf("%d connections open, %d at once, want at most the limit of %d (and the one being let in)", open, most, limit)
			}
		})
	}
}

// A process posting a flood of reports under one worker's name gets at most the burst into the journal; the
// rest are refused with Sedna's reply shape and counted, while another worker's reports are still taken, and
// the flooded worker gets its rate back as time passes.
func TestAWorkerFloodingReportsIsLimitedAndOthersAreNot(t *testing.T) {
	s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { return nil }),
		workerSet{"default/sdd-trainworker-0": true, "default/sdd-trainworker-1": true}, func() uint64 { return 1 }, 1000, nil, logr.Discard())
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var clockMu sync.Mutex
	s.now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	other := strings.ReplaceAll(validBody, "sdd-trainworker-0", "sdd-trainworker-1")

	const flood = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes, messages := map[int]int{}, map[string]bool{}
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, reply := post(t, srv.URL, "sdd-trainworker-0", validBody)
			mu.Lock()
			defer mu.Unlock()
			codes[code]++
			if code != http.StatusOK {
				messages[fmt.Sprint(reply["status"], " ", reply["message"])] = true
			}
		}()
	}
	wg.Wait()
	refused := flood - DefaultReportBurst
	if codes[200] != DefaultReportBurst || codes[429] != refused {
		t.Errorf("replies %v to %d reports at once, want %d taken and %d refused with 429", codes, flood, DefaultReportBurst, refused)
	}
	want := "429 default/sdd-trainworker-0 reports more than 5 a second (burst 20); report dropped"
	if len(messages) != 1 || !messages[want] {
		t.Errorf("refusals %v, want %q", messages, want)
	}
	if n := testutil.ToFloat64(s.received.WithLabelValues("rejected_rate_limited")); n != float64(refused) {
		t.Errorf("%v reports counted rejected_rate_limited, want %d", n, refused)
	}
	if n := len(s.queue); n != DefaultReportBurst {
		t.Errorf("%d reports queued, want the burst of %d", n, DefaultReportBurst)
	}

	for _, step := range []struct {
		name          string
		worker, body  string
		advance       time.Duration
		posts, wantOK int
	}{
		{"another worker is not limited by the flood", "sdd-trainworker-1", other, 0, 3, 3},
		{"the flooded worker, at once", "sdd-trainworker-0", validBody, 0, 1, 0},
		{"the flooded worker, a second later: the rate", "sdd-trainworker-0", validBody, time.Second, 6, 5},
	} {
		t.Run(step.name, func(t *testing.T) {
			clockMu.Lock()
			clock = clock.Add(step.advance)
			clockMu.Unlock()
			ok := 0
			for range step.posts {
				if code, _ := post(t, srv.URL, step.worker, step.body); code == http.StatusOK {
					ok++
				}
			}
			if ok != step.wantOK {
				t.Errorf("%d of %d reports taken, want %d", ok, step.posts, step.wantOK)
			}
		})
	}
}

// Rate-limit state cannot be grown by what callers post: past maxLimitedWorkers buckets, a new worker is
// refused until buckets refill and are forgotten.
func TestRateLimitStateIsBounded(t *testing.T) {
	s := New("c", "edge-1", sinkFunc(func(journal.Entry) error { return nil }), anyWorker{}, func() uint64 { return 1 },
		maxLimitedWorkers+1, nil, logr.Discard())
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return clock }
	postAs := func(name string) int {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/sedna/workers/"+name+"/info",
			strings.NewReader(`{"name":"`+name+`","namespace":"default"}`)))
		return rec.Code
	}
	for i := range maxLimitedWorkers {
		if code := postAs(fmt.Sprintf("w-%d", i)); code != http.StatusOK {
			t.Fatalf("worker %d answered %d", i, code)
		}
	}
	if code := postAs("one-too-many"); code != http.StatusTooManyRequests {
		t.Errorf("a worker past the bound answered %d, want 429", code)
	}
	clock = clock.Add(time.Second) // every bucket is full again
	if code := postAs("one-too-many"); code != http.StatusOK {
		t.Errorf("a worker answered %d once the buckets refilled, want 200", code)
	}
	if n := len(s.limits.buckets); n > maxLimitedWorkers {
		t.Errorf("%d buckets kept, over the bound of %d", n, maxLimitedWorkers)
	}
}

// anyWorker takes every name as one of the node's workers.
type anyWorker struct{}

func (anyWorker) HasWorker(string, string) bool { return true }

// An agent that stops (an upgrade hands the node to its new pod) journals every report it answered OK, and
// refuses later ones with a code Sedna's library tries again on, so that they reach the next agent.
func TestAStoppingAgentJournalsEveryReportItTookAndRefusesTheRest(t *testing.T) {
	var journaled []journal.Entry
	s := New("c", "edge-1", sinkFunc(func(e journal.Entry) error { journaled = append(journaled, e); return nil }),
		workerSet{"default/sdd-trainworker-0": true}, func() uint64 { return 7 }, 10, nil, logr.Discard())
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	// Taken while the journal's consumer is behind: still queued when the agent is told to stop.
	for i := 0; i < 3; i++ {
		if code, reply := post(t, srv.URL, "sdd-trainworker-0", validBody); code != http.StatusOK {
			t.Fatalf("report %d: %d %v", i, code, reply)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Run(ctx)
	if len(journaled) != 3 {
		t.Fatalf("%d reports journaled at the stop, want the 3 answered OK", len(journaled))
	}
	code, reply := post(t, srv.URL, "sdd-trainworker-0", validBody)
	if code != http.StatusServiceUnavailable || !strings.Contains(reply["message"].(string), "report again") {
		t.Errorf("a report after the stop: %d %v, want 503 asking to report again", code, reply)
	}
	if got := testutil.ToFloat64(s.received.WithLabelValues("refused_stopping")); got != 1 {
		t.Errorf("refused_stopping %v, want 1", got)
	}
	if len(journaled) != 3 {
		t.Errorf("%d reports journaled, want 3: one refused is not taken", len(journaled))
	}
}
