// Package reportapi serves the Sedna worker report API on the node (`POST /sedna/workers/<name>/info`), so
// unmodified Sedna worker images report through Lifeline. It answers at once and never blocks a worker: valid
// reports go into a bounded queue that a single goroutine hands to the publisher; when the queue is full the
// report is dropped and counted. Reports of workers that are not the node's — those of a Sedna installation's
// own workers, say — are refused, or, with a forward address, handed on to Sedna's local controller the same way:
// through a bounded queue, one at a time, each post bounded by ForwardTimeout.
package reportapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
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

// Server is the report endpoint of one node.
type Server struct {
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

	// forwardTo is the base URL of Sedna's local controller, or "": reports of other workers are refused.
	forwardTo string
	forwards  chan forward
	client    *http.Client

	received  *prometheus.CounterVec
	forwarded *prometheus.CounterVec
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
	s := &Server{cluster: cluster, node: node, sink: sink, workers: workers, birthSeq: birthSeq, log: log,
		queue: make(chan *lifelinev1.WorkerReport, capacity),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeline_agent_reports_total",
			Help: "Worker reports received by the node's report endpoint, by outcome (queued, dropped, forwarding, forward_dropped, rejected_*: too_large, malformed, name_mismatch, not_a_worker).",
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
	msg := &lifelinev1.WorkerReport{Namespace: rep.Namespace, Worker: rep.Name, Body: body,
		ReceivedUnixNano: time.Now().UnixNano()}
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
// order, until ctx ends.
func (s *Server) Run(ctx context.Context) {
	if s.forwardTo != "" {
		go s.runForwards(ctx)
	}
	topic := lifelinev1.NodeTopic(s.cluster, s.node, lifelinev1.KindReport).String()
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-s.queue:
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

// ListenAndServe serves the API on addr until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	srv := &http.Server{Addr: addr, Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the report API on %s: %w", addr, err)
	}
	return nil
}
