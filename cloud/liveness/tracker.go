// Package liveness is the controller's view of the edge as its agents report it over MQTT: a table of nodes
// (online, birth sequence, last heartbeat, whether the node reaches the API server) and of workers (state, seq,
// last seen), the merge rule that says whose word is the truth for a worker, and the fenced restart commands
// the controller sends to an agent whose node is cut off from the API server.
package liveness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Drop reasons, the values of the dropped-messages metric's reason label.
const (
	DropTopic    = "topic"    // the topic does not parse or is not this cluster's
	DropDecode   = "decode"   // the payload does not decode as the topic's message
	DropForged   = "forged"   // the payload names another node or worker than its topic [P-AUTH-3]
	DropReplayed = "replayed" // an old seq or an old birth [P-WS-2] [P-DEATH-2]
	DropUnknown  = "no-birth" // a node's message before any birth of it was seen
	DropDenied   = "acl"      // refused by the embedded broker's ACL
	DropAuth     = "auth"     // a connection refused for its credentials or will
	dropReasons  = "topic decode forged replayed no-birth acl auth"
)

// heartbeatInterval is the agents' default; a node is silent after three of them without a heartbeat.
const heartbeatInterval = time.Second

// nodeRecord is what the table knows of one node.
type nodeRecord struct {
	birthSeq      uint64
	bootID        string
	dead          bool // a death of the current birth arrived
	lastHeartbeat time.Time
	heartbeatSeq  uint64
	reportSeq     uint64
	apiReachable  bool
}

// workerRecord is the latest accepted state of one worker.
type workerRecord struct {
	node  string
	pod   string // namespace/name
	state *lifelinev1.WorkerState
	at    time.Time // when the controller accepted it
}

// Tracker ingests the agents' messages. It is safe for concurrent use.
type Tracker struct {
	Cluster string
	// SilentAfter: a node whose heartbeats stopped this long is silent (three default intervals).
	SilentAfter time.Duration
	// PodNode, when set, tells the node a pod is bound to, so a node's word on another node's pod is dropped
	// as forged [P-AUTH-3]; pods it does not know are taken at the node's word.
	PodNode func(namespace, name string) (string, bool)
	Log     logr.Logger

	received *prometheus.CounterVec
	dropped  *prometheus.CounterVec

	mu          sync.Mutex
	nodes       map[string]*nodeRecord
	workers     map[string]*workerRecord // node/namespace/pod
	online      map[string]bool          // as last announced to subscribers
	subscribers []*subscriber
	actions     map[string][]*lifelinev1.CommandResult // namespace/pod -> restarts by agents not yet taken
	sent        map[string]sentCommand                 // restart command id -> what and when
	reports     map[string]map[string]Report           // ownerKey -> worker -> latest report
	loggedDrop  map[string]bool
}

// NewTracker returns a tracker whose metrics are registered with reg.
func NewTracker(cluster string, reg prometheus.Registerer, log logr.Logger) (*Tracker, error) {
	t := &Tracker{Cluster: cluster, SilentAfter: 3 * heartbeatInterval, Log: log,
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_liveness_messages_total",
			Help: "Agent messages accepted, by kind."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_liveness_dropped_total",
			Help: "Agent messages and connections dropped, by reason: " + dropReasons + "."}, []string{"reason"}),
		nodes: map[string]*nodeRecord{}, workers: map[string]*workerRecord{}, online: map[string]bool{},
		actions: map[string][]*lifelinev1.CommandResult{}, sent: map[string]sentCommand{}, reports: map[string]map[string]Report{}, loggedDrop: map[string]bool{}}
	for _, c := range []prometheus.Collector{t.received, t.dropped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering liveness metrics: %w", err)
		}
	}
	return t, nil
}

// Subscribe returns a channel that receives a pod (namespace and name only) whenever what the table says of
// that worker may have changed; the controllers map it to the workload that owns the pod. Changes are never
// lost: while the reader is behind, they are coalesced per pod.
func (t *Tracker) Subscribe() <-chan event.GenericEvent {
	sub := &subscriber{ch: make(chan event.GenericEvent), wake: make(chan struct{}, 1), pending: map[string]bool{}}
	go sub.deliver()
	t.mu.Lock()
	t.subscribers = append(t.subscribers, sub)
	t.mu.Unlock()
	return sub.ch
}

// subscriber hands changes to one reader at its pace.
type subscriber struct {
	ch   chan event.GenericEvent
	wake chan struct{}

	mu      sync.Mutex
	pending map[string]bool // keys: namespace/pod, or a workload's ownerKey
}

func (s *subscriber) add(keys []string) {
	s.mu.Lock()
	for _, k := range keys {
		s.pending[k] = true
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) deliver() {
	for range s.wake {
		s.mu.Lock()
		batch := s.pending
		s.pending = map[string]bool{}
		s.mu.Unlock()
		for key := range batch {
			s.ch <- event.GenericEvent{Object: changedObject(key)}
		}
	}
}

// Drop counts a message dropped before it reached the tracker (the broker's ACL and authentication).
func (t *Tracker) Drop(reason, detail string) {
	t.dropped.WithLabelValues(reason).Inc()
	t.mu.Lock()
	first := !t.loggedDrop[reason]
	t.loggedDrop[reason] = true
	t.mu.Unlock()
	if first { // once per reason: a flood of garbage must not flood the log [P-BAD-1]
		t.Log.Info("dropping agent messages", "reason", reason, "example", detail)
	}
}

// Ingest takes one message as it arrived on topic. Nothing it is given can make it fail: what is not acceptable
// is dropped and counted.
func (t *Tracker) Ingest(topic string, payload []byte, now time.Time) {
	tp, err := lifelinev1.ParseTopic(topic)
	if err != nil || tp.Cluster != t.Cluster {
		t.Drop(DropTopic, topic)
		return
	}
	var msg proto.Message
	switch tp.Kind {
	case lifelinev1.KindBirth:
		msg = &lifelinev1.NodeBirth{}
	case lifelinev1.KindDeath:
		msg = &lifelinev1.NodeDeath{}
	case lifelinev1.KindHeartbeat:
		msg = &lifelinev1.Heartbeat{}
	case lifelinev1.KindWorkerState:
		msg = &lifelinev1.WorkerState{}
	case lifelinev1.KindResult:
		msg = &lifelinev1.CommandResult{}
	case lifelinev1.KindReport:
		msg = &lifelinev1.WorkerReport{}
	default: // commands: the controller's own, back through its subscription to every node topic
		return
	}
	if err := proto.Unmarshal(payload, msg); err != nil {
		t.Drop(DropDecode, topic)
		return
	}
	var changed []string
	t.mu.Lock()
	reason := t.apply(tp, msg, now, &changed)
	t.mu.Unlock()
	if reason != "" {
		t.Drop(reason, topic)
		return
	}
	t.received.WithLabelValues(tp.Kind.String()).Inc()
	t.notify(changed)
}

// apply updates the table with t.mu held, listing the workers whose view changed; it returns a drop reason.
func (t *Tracker) apply(tp lifelinev1.Topic, msg proto.Message, now time.Time, changed *[]string) string {
	n := t.nodes[tp.Node]
	switch m := msg.(type) {
	case *lifelinev1.NodeBirth:
		if m.Node != tp.Node {
			return DropForged
		}
		if n != nil && m.BirthSeq < n.birthSeq {
			return DropReplayed
		}
		if n == nil {
			n = &nodeRecord{}
			t.nodes[tp.Node] = n
		}
		n.birthSeq, n.bootID, n.dead, n.lastHeartbeat = m.BirthSeq, m.BootId, false, now
		*changed = t.workersOf(tp.Node)
	case *lifelinev1.NodeDeath:
		switch {
		case m.Node != tp.Node:
			return DropForged
		case n == nil:
			return DropUnknown
		case m.BirthSeq < n.birthSeq:
			return DropReplayed // a late death never overrides a newer birth [P-DEATH-2]
		}
		n.dead = true
		*changed = t.workersOf(tp.Node)
	case *lifelinev1.Heartbeat:
		switch {
		case n == nil:
			return DropUnknown
		case m.BirthSeq < n.birthSeq || (m.BirthSeq == n.birthSeq && m.Seq <= n.heartbeatSeq):
			return DropReplayed
		}
		if m.BirthSeq > n.birthSeq { // the birth was missed (QoS 1 vs 0 ordering): the heartbeat proves the session
			n.birthSeq, n.dead = m.BirthSeq, false
		}
		flipped := n.apiReachable != m.ApiReachable || n.dead
		n.lastHeartbeat, n.heartbeatSeq, n.apiReachable, n.dead = now, m.Seq, m.ApiReachable, false
		if flipped {
			*changed = t.workersOf(tp.Node)
		}
	case *lifelinev1.WorkerState:
		if m.Namespace != tp.Namespace || m.Name != tp.Pod {
			return DropForged
		}
		if node, known := t.podNode(m.Namespace, m.Name); known && node != tp.Node {
			return DropForged
		}
		// Kept per node: what one node says of a pod never overwrites what the pod's own node says.
		key := m.Namespace + "/" + m.Name
		if w := t.workers[tp.Node+"/"+key]; w != nil && m.Seq <= w.state.Seq {
			return DropReplayed
		}
		t.workers[tp.Node+"/"+key] = &workerRecord{node: tp.Node, pod: key, state: m, at: now}
		*changed = []string{key}
	case *lifelinev1.CommandResult:
		key := t.workerOfResult(tp.Node, m.CommandId)
		if key == "" {
			return DropForged // neither a command of ours to this node nor a local restart
		}
		t.actions[key] = append(t.actions[key], m)
		*changed = []string{key}
	case *lifelinev1.WorkerReport:
		key, reason := t.applyReport(tp.Node, m, now)
		if reason != "" {
			return reason
		}
		*changed = []string{key}
	}
	return ""
}

func (t *Tracker) workersOf(node string) []string {
	var keys []string
	for _, w := range t.workers {
		if w.node == node {
			keys = append(keys, w.pod)
		}
	}
	return keys
}

// notify tells every subscriber about the changed workers.
func (t *Tracker) notify(keys []string) {
	if len(keys) == 0 {
		return
	}
	t.mu.Lock()
	subs := append([]*subscriber(nil), t.subscribers...)
	t.mu.Unlock()
	for _, sub := range subs {
		sub.add(keys)
	}
}

// changedObject is what a subscriber receives for a key: a pod (namespace and name only) whose view changed, or
// a workload (kind, namespace and name) whose workers reported.
func changedObject(key string) client.Object {
	if rest, isReport := strings.CutPrefix(key, "report/"); isReport {
		parts := strings.SplitN(rest, "/", 3)
		return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: parts[0], APIVersion: v1alpha1.GroupVersion.String()},
			ObjectMeta: metav1.ObjectMeta{Namespace: parts[1], Name: parts[2]}}
	}
	ns, name, _ := strings.Cut(key, "/")
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// Run watches for nodes going silent (no message arrives to say so) until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.SilentAfter / 6)
	defer tick.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.notify(t.onlineChanges(now))
			if now.Sub(lastPrune) >= time.Minute {
				t.prune(now)
				lastPrune = now
			}
		}
	}
}

// forgetAfter is how long the table keeps what nobody asks for any more: the states of pods that are gone from
// the API server, results no reconcile took, reports of workloads that stopped reporting.
const forgetAfter = time.Hour

// prune forgets what is older than forgetAfter and no longer matters, so the table does not grow with every
// pod and workload that ever was.
func (t *Tracker) prune(now time.Time) {
	t.mu.Lock()
	var stale []*workerRecord
	for _, w := range t.workers {
		if now.Sub(w.at) > forgetAfter {
			stale = append(stale, w)
		}
	}
	t.mu.Unlock()
	var gone []string
	for _, w := range stale { // asked outside the lock: PodNode reads the cache
		ns, name, _ := strings.Cut(w.pod, "/")
		if node, known := t.podNode(ns, name); !known || node != w.node {
			gone = append(gone, w.node+"/"+w.pod)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, key := range gone {
		if w := t.workers[key]; w != nil && now.Sub(w.at) > forgetAfter {
			delete(t.workers, key)
		}
	}
	for key, results := range t.actions {
		if last := results[len(results)-1]; now.Sub(time.Unix(0, last.TimeUnixNano)) > forgetAfter {
			delete(t.actions, key)
		}
	}
	for owner, workers := range t.reports {
		for name, r := range workers {
			if now.Sub(r.At) > forgetAfter {
				delete(workers, name)
			}
		}
		if len(workers) == 0 {
			delete(t.reports, owner)
		}
	}
}

// podNode is PodNode, or "not known" without it.
func (t *Tracker) podNode(namespace, name string) (string, bool) {
	if t.PodNode == nil {
		return "", false
	}
	return t.PodNode(namespace, name)
}

func (t *Tracker) onlineChanges(now time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var changed []string
	for name, n := range t.nodes {
		online := t.isOnline(n, now)
		if t.online[name] != online {
			t.online[name] = online
			changed = append(changed, t.workersOf(name)...)
		}
	}
	return changed
}

func (t *Tracker) isOnline(n *nodeRecord, now time.Time) bool {
	return n != nil && !n.dead && now.Sub(n.lastHeartbeat) < t.SilentAfter
}

// workerOfResult finds the worker a result is about: a command sent to that node, or a local restart
// (id "local/<namespace>/<pod>/<uid>/<time>") [P-HEAL-2].
func (t *Tracker) workerOfResult(node, id string) string {
	if c, ok := t.sent[id]; ok && c.node == node {
		return c.worker
	}
	if parts := strings.Split(id, "/"); len(parts) == 5 && parts[0] == "local" {
		return parts[1] + "/" + parts[2]
	}
	return ""
}

// TakeActions returns, once, what agents reported doing to the worker pod (restarts on command or by the
// offline policy), oldest first.
func (t *Tracker) TakeActions(namespace, pod string) []*lifelinev1.CommandResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := namespace + "/" + pod
	out := t.actions[key]
	delete(t.actions, key)
	return out
}
