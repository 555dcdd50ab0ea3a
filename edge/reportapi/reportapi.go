// Package reportapi serves the Sedna worker report API on the node (`POST /sedna/workers/<name>/info`), so
// unmodified Sedna worker images report through Lifeline. It answers at once and never blocks a worker: valid
// reports go into a bounded queue that a single goroutine hands to the publisher; when the queue is full the
// report is dropped and counted. Reports of workers that are not the node's — those of a Sedna installation's
// own workers, say — are refused, or, with a forward address, handed on to Sedna's local controller the same way:
// through a bounded queue, one at a time, each post bounded by ForwardTimeout.
//
// Any process of the node can reach the endpoint, so what one caller can take of the agent is bounded: the
// connections served at once, the bytes of a request's headers and body, the time a connection may take, and,
// per worker, the reports a second that go into the journal.
package reportapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/internal/listen"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// MaxBodyBytes bounds one report; Sedna's reports are a few hundred bytes.
const MaxBodyBytes = lifelinev1.MaxReportBodyBytes

// Sink takes a journal entry for the broker (the publisher's Enqueue).
type Sink interface {
	Enqueue(journal.Entry) error
}

// Workers tells which workers belong on this node (the desired workers).
type Workers interface {
	HasWorker(namespace, name string) bool
}

// ForwardTimeout bounds one forwarded report's post to Sedna's local controller.
const ForwardTimeout = 3 * time.Second

// DefaultMaxConnections bounds the connections the endpoint serves at once: each may hold MaxHeaderBytes and
// MaxBodyBytes in memory, so 64 of them stay within a few MiB of the agent's 64 Mi memory limit, while a node's
// workers, which post one report every few seconds and hold at most one connection each, never come near it.
const DefaultMaxConnections = 64

// MaxHeaderBytes bounds one request's headers: Sedna's workers send a handful of short ones, and the standard
// library's default (1 MiB) would let a few dozen slow connections exhaust the agent's memory.
const MaxHeaderBytes = 16 << 10

// DefaultReportRate and DefaultReportBurst bound the reports a second one worker gets into the journal. Sedna's
// workers report every LC_PERIOD (3 s by default) or once a training round, and a joint inference Deployment's
// replicas share one name, so 5 a second with a burst of 20 leaves the real library ample room while a process
// flooding the endpoint under a worker's name cannot fill the journal.
const (
	DefaultReportRate  = 5.0
	DefaultReportBurst = 20
)

// Timeouts of one connection: a report is a few hundred bytes, so a client that has not sent its headers within
// readHeaderTimeout or its whole request within readTimeout is holding a connection, not reporting.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 10 * time.Second
	idleTimeout       = 30 * time.Second
	// shutdownGrace is how long a stopping server waits for the requests it is reading.
	shutdownGrace = 2 * time.Second
)

// Server is the report endpoint of one node.
type Server struct {
	// MaxConnections bounds the connections served at once (0: DefaultMaxConnections); a further one takes the
	// place of the oldest that is not being answered (connPool). Set it before serving.
	MaxConnections int
	// ReportRate and ReportBurst are each worker's token bucket: a worker's reports beyond it are refused with
	// 429 and counted, so no caller posting under a worker's name can fill the journal. ReportRate <= 0 takes
	// every report. Set them before serving.
	ReportRate  float64
	ReportBurst int

	// Counter, when set, numbers reports with a sequence that survives agent restarts (the journal's), so the
	// controller's replay check holds across them [P-REP-1]; nil numbers them from 1 in memory.
	Counter interface {
		NextCounter(name string) (uint64, error)
	}

	cluster, node string
	sink          Sink
	workers       Workers
	birthSeq      func() uint64
	queue         chan *lifelinev1.WorkerReport
	log           logr.Logger
	seq           uint64 // touched by the consumer goroutine only
	// stopping is set when Run ends: a report answered OK is journaled, so none is taken once the queue is
	// drained for the last time. Handlers hold it shared while they queue.
	stopping struct {
		sync.RWMutex
		done bool
	}
	// serving tells whether Serve runs; shutDown is closed once its server has stopped and every request it
	// took is answered.
	serving  atomic.Bool
	shutDown chan struct{}

	// forwardTo is the base URL of Sedna's local controller, or "": reports of other workers are refused.
	forwardTo string
	forwards  chan forward
	client    *http.Client

	received  *prometheus.CounterVec
	forwarded *prometheus.CounterVec

	limits reportLimiter
	now    func() time.Time // the rate limit's clock; tests set it
}

// forward is a report to hand on, as it was posted.
type forward struct {
	name string
	body []byte
}

// New returns a server with a queue of capacity reports; register its metrics with reg (nil: not registered).
// Only reports for one of workers are taken: the endpoint listens on the host network, where any process of
// the node could post, and the controller would credit the report to the named worker.
func New(cluster, node string, sink Sink, workers Workers, birthSeq func() uint64, capacity int, reg prometheus.Registerer, log logr.Logger) *Server {
	s := &Server{MaxConnections: DefaultMaxConnections, ReportRate: DefaultReportRate, ReportBurst: DefaultReportBurst, now: time.Now,
		cluster: cluster, node: node, sink: sink, workers: workers, birthSeq: birthSeq, log: log,
		queue: make(chan *lifelinev1.WorkerReport, capacity), shutDown: make(chan struct{}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeline_agent_reports_total",
			Help: "Worker reports received by the node's report endpoint, by outcome (queued, dropped, forwarding, forward_dropped, refused_stopping: posted while the agent stops, rejected_*: too_large, malformed, name_mismatch, not_a_worker, rate_limited: over the worker's reports a second).",
		}, []string{"outcome"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeline_agent_reports_forwarded_total",
			Help: "Reports of workers not the node's handed on to Sedna's local controller, by outcome (sent, failed: unreachable, timed out or refused).",
		}, []string{"outcome"}),
		client: &http.Client{Timeout: ForwardTimeout},
	}
	if reg != nil {
		reg.MustRegister(s.received, s.forwarded)
	}
	return s
}

// ForwardUnowned makes the server hand reports of workers that are not the node's on to Sedna's local
// controller at baseURL (e.g. http://127.0.0.1:9100), through a queue of capacity reports, instead of refusing
// them. Call it before serving.
func (s *Server) ForwardUnowned(baseURL string, capacity int) {
	s.forwardTo = strings.TrimRight(baseURL, "/")
	s.forwards = make(chan forward, capacity)
}

// Handler is the HTTP handler of the report API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sedna/workers/{name}/info", s.receive)
	return mux
}

func (s *Server) receive(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		s.reject(w, "too_large", http.StatusRequestEntityTooLarge, fmt.Sprintf("report body over %d bytes", MaxBodyBytes))
		return
	}
	var rep lifelinev1.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		s.reject(w, "malformed", http.StatusBadRequest, "report body is not the worker report JSON: "+err.Error())
		return
	}
	if rep.Name != name {
		s.reject(w, "name_mismatch", http.StatusBadRequest, fmt.Sprintf("report for %q posted to the path of %q", rep.Name, name))
		return
	}
	if err := lifelinev1.CheckDNSLabel(rep.Namespace); err != nil {
		s.reject(w, "malformed", http.StatusBadRequest, "namespace: "+err.Error())
		return
	}
	if !s.workers.HasWorker(rep.Namespace, rep.Name) {
		if s.forwardTo == "" {
			s.reject(w, "not_a_worker", http.StatusForbidden, fmt.Sprintf("%s/%s is not a worker of this node", rep.Namespace, rep.Name))
			return
		}
		select {
		case s.forwards <- forward{name: name, body: body}:
			s.received.WithLabelValues("forwarding").Inc()
			writeReply(w, http.StatusOK, "OK")
		default:
			s.received.WithLabelValues("forward_dropped").Inc()
			writeReply(w, http.StatusServiceUnavailable, "forward queue full; report dropped")
		}
		return
	}
	if !s.limits.allow(rep.Namespace+"/"+rep.Name, s.now(), s.ReportRate, s.ReportBurst) {
		s.reject(w, "rate_limited", http.StatusTooManyRequests,
			fmt.Sprintf("%s/%s reports more than %g a second (burst %d); report dropped", rep.Namespace, rep.Name, s.ReportRate, s.ReportBurst))
		return
	}
	msg := &lifelinev1.WorkerReport{Namespace: rep.Namespace, Worker: rep.Name, Body: body,
		ReceivedUnixNano: time.Now().UnixNano()}
	s.stopping.RLock()
	defer s.stopping.RUnlock()
	if s.stopping.done {
		s.received.WithLabelValues("refused_stopping").Inc()
		writeReply(w, http.StatusServiceUnavailable, "the node's agent is stopping; report again")
		return
	}
	select {
	case s.queue <- msg:
		s.received.WithLabelValues("queued").Inc()
		writeReply(w, http.StatusOK, "OK")
	default:
		s.received.WithLabelValues("dropped").Inc()
		writeReply(w, http.StatusServiceUnavailable, "report queue full; report dropped")
	}
}

func (s *Server) reject(w http.ResponseWriter, reason string, code int, message string) {
	s.received.WithLabelValues("rejected_" + reason).Inc()
	writeReply(w, code, message)
}

// writeReply answers as Sedna's LC does: {"status": <code>, "message": "..."}.
func writeReply(w http.ResponseWriter, code int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": code, "message": message})
}

// Run hands queued reports to the sink, and reports to forward to Sedna's local controller, each in arrival
// order, until ctx ends. Then it refuses new reports (503: the worker's library tries again, and reaches the
// agent that replaces this one) and journals every report still queued: a report answered OK is never lost.
func (s *Server) Run(ctx context.Context) {
	if s.forwardTo != "" {
		go s.runForwards(ctx)
	}
	topic := lifelinev1.NodeTopic(s.cluster, s.node, lifelinev1.KindReport).String()
	for {
		select {
		case <-ctx.Done():
			if s.serving.Load() {
				// The requests being read when the listener closed are queued, not refused.
				select {
				case <-s.shutDown:
				case <-time.After(shutdownGrace):
				}
			}
			s.stopping.Lock()
			s.stopping.done = true
			s.stopping.Unlock()
			for {
				select {
				case msg := <-s.queue:
					s.journal(topic, msg)
				default:
					return
				}
			}
		case msg := <-s.queue:
			s.journal(topic, msg)
		}
	}
}

// journal numbers msg and hands it to the sink.
func (s *Server) journal(topic string, msg *lifelinev1.WorkerReport) {
	seq, err := s.nextSeq()
	msg.Seq, msg.BirthSeq = seq, s.birthSeq()
	var payload []byte
	if err == nil {
		payload, err = proto.Marshal(msg)
	}
	if err == nil {
		err = s.sink.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1})
	}
	if err != nil {
		s.log.Error(err, "journaling a report", "worker", msg.Worker)
	}
}

// runForwards posts each forwarded report, as it was posted here, to the same path on Sedna's local controller.
// A report that does not get there within ForwardTimeout, or is refused, is counted and dropped: the worker was
// answered long ago, and a controller that is down must not make the queue hold reports for ever.
func (s *Server) runForwards(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-s.forwards:
			if err := s.post(ctx, f); err != nil {
				s.forwarded.WithLabelValues("failed").Inc()
				s.log.V(2).Info("forwarding a report to Sedna's local controller", "worker", f.name, "error", err.Error())
				continue
			}
			s.forwarded.WithLabelValues("sent").Inc()
		}
	}
}

func (s *Server) post(ctx context.Context, f forward) error {
	target := s.forwardTo + "/sedna/workers/" + url.PathEscape(f.name) + "/info"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(f.body))
	if err != nil {
		return fmt.Errorf("building the request to %s: %w", target, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("posting to %s: %w", target, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("posting to %s: %s", target, resp.Status)
	}
	return nil
}

func (s *Server) nextSeq() (uint64, error) {
	if s.Counter != nil {
		return s.Counter.NextCounter("report")
	}
	s.seq++
	return s.seq, nil
}

// ListenAndServe serves the API on addr until ctx ends, as Serve does, on both loopback addresses when addr is
// one (listen.Addresses: Sedna's workers post to localhost, which may resolve to ::1 first). An address another
// process holds is tried again until the agent gets it, logged meanwhile: the agent keeps heartbeating and
// healing, where exiting would crash-loop it and leave the port to the other process.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	addrs, err := listen.Addresses(addr)
	if err != nil {
		return fmt.Errorf("the report API's address: %w", err)
	}
	srv, pool := s.start(ctx)
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Go(func() {
			if ln := listen.WhenFree(ctx, a, "the report API", s.log); ln != nil {
				if err := s.serveOn(srv, ln, pool); err != nil {
					s.log.Error(err, "the report API stopped serving", "address", a)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// Serve serves the API on ln until ctx ends, and closes ln. It serves at most MaxConnections connections at
// once, each within MaxHeaderBytes of headers and the connection timeouts above, so that slow or oversized
// requests from any process of the node cost the agent a bounded amount of memory.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv, pool := s.start(ctx)
	return s.serveOn(srv, ln, pool)
}

// start makes the server every listener is served by, shut down when ctx ends, and the pool of connections they
// share.
func (s *Server) start(ctx context.Context) (*http.Server, *connPool) {
	limit := s.MaxConnections
	if limit <= 0 {
		limit = DefaultMaxConnections
	}
	srv := &http.Server{Handler: answering(s.Handler(), MaxBodyBytes), ConnContext: withPooledConn, MaxHeaderBytes: MaxHeaderBytes,
		ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout, WriteTimeout: writeTimeout, IdleTimeout: idleTimeout}
	s.serving.Store(true)
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		close(s.shutDown)
	}()
	return srv, newConnPool(limit)
}

// serveOn serves srv on ln, within the shared pool, until srv is shut down.
func (s *Server) serveOn(srv *http.Server, ln net.Listener, pool *connPool) error {
	if err := srv.Serve(pool.listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the report API on %s: %w", ln.Addr(), err)
	}
	return nil
}

// maxLimitedWorkers bounds the token buckets kept: only the node's own workers get one, so this is never reached
// in practice, but the map must not grow with anything a caller controls.
const maxLimitedWorkers = 4096

// reportLimiter is a token bucket per worker (namespace/name).
type reportLimiter struct {
	mu      sync.Mutex
	buckets map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

// refill brings b up to now at perSecond, up to burst.
func (b *tokenBucket) refill(now time.Time, perSecond float64, burst int) {
	if elapsed := now.Sub(b.at).Seconds(); elapsed > 0 {
		b.tokens = min(float64(burst), b.tokens+elapsed*perSecond)
	}
	b.at = now
}

// allow takes a token of key's bucket at now, or says there is none. A bucket that has filled up again is as
// good as none, so those are forgotten when the map is at its bound; past it, new workers are refused rather
// than the map grown.
func (l *reportLimiter) allow(key string, now time.Time, perSecond float64, burst int) bool {
	if perSecond <= 0 {
		return true
	}
	burst = max(burst, 1) // a bucket that holds no token would refuse every report
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]*tokenBucket{}
	}
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxLimitedWorkers {
			for k, other := range l.buckets {
				if other.refill(now, perSecond, burst); other.tokens >= float64(burst) {
					delete(l.buckets, k)
				}
			}
		}
		if len(l.buckets) >= maxLimitedWorkers {
			return false
		}
		b = &tokenBucket{tokens: float64(burst), at: now}
		l.buckets[key] = b
	}
	b.refill(now, perSecond, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
