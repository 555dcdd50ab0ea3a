package reportapi

import (
	"context"
	"encoding/json"
	"io"
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
