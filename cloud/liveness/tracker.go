// Package liveness is the controller's view of the edge as its agents report it over MQTT: a table of nodes
// (online, birth sequence, last heartbeat, whether the node reaches the API server) and of workers (state, seq,
// last seen), the merge rule that says whose word is the truth for a worker, and the fenced restart commands
// the controller sends to an agent whose node is cut off from the API server.
package liveness

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/internal/promreg"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Drop reasons, the values of the dropped-messages metric's reason label.
const (
	DropTopic          = "topic"           // the topic does not parse or is not this cluster's
	DropDecode         = "decode"          // the payload does not decode as the topic's message, or is too large to be one
	DropForged         = "forged"          // the payload names another node or worker than its topic, or a pod of another node [P-AUTH-3]
	DropReplayed       = "replayed"        // an old seq or an old birth [P-WS-2] [P-DEATH-2]
	DropUnknown        = "no-birth"        // a node's message before any birth of it was seen
	DropUnknownNode    = "unknown-node"    // a message that would give a node a record while it is no edge Node of the API server
	DropUnknownPod     = "unknown-pod"     // a result or report on a pod the API server does not have, or a state of one that stayed unknown
	DropUnknownDataset = "unknown-dataset" // a count of a Dataset the API server does not have
	DropOverflow       = "overflow"        // a bound of the table for the node is reached
	DropDenied         = "acl"             // refused by the embedded broker's ACL
	DropAuth           = "auth"            // a connection refused for its credentials or will
	dropReasons        = "topic decode forged replayed no-birth unknown-node unknown-pod unknown-dataset overflow acl auth"
)

// The table's bounds: what one node can make the controller keep.
const (
	// maxPayloadBytes bounds a message: the largest report body and its envelope.
	maxPayloadBytes = lifelinev1.MaxReportBodyBytes + 1024
	// maxNodes bounds the nodes the table knows, a safety net: with Tracker.Nodes only current edge Nodes get a
	// record and a node that goes is forgotten (ForgetNode, prune), so it is the cluster's edge Nodes that bound
	// the table, not every name ever seen.
	maxNodes = 10000
	// nodeLookupTimeout bounds how long a message waits for the Node cache's answer.
	nodeLookupTimeout = 5 * time.Second
	// maxWorkersPerNode bounds the worker states kept per node, far above the pods a node runs (110 by default).
	maxWorkersPerNode = 1024
	// maxPendingPerNode bounds the states kept per node of pods the API server's cache does not know (yet), and
	// pendingFor how long one is kept unless the cache learns the pod: a new pod reaches the agent and the
	// controller's cache at about the same moment, so its first state is never lost to the cache's lag.
	maxPendingPerNode = 16
	pendingFor        = 30 * time.Second
	// maxResultsPerNode bounds the results of a node that no reconcile took yet.
	maxResultsPerNode = 64
	// maxReportsPerNode bounds the workers a node's reports are kept for.
	maxReportsPerNode = 64
)

// nodeRecord is what the table knows of one node.
type nodeRecord struct {
	born          bool // a birth of the node arrived
	birthSeq      uint64
	bootID        string
	stateID       string
	dead          bool // a death of the current birth arrived
	lastHeartbeat time.Time
	// silentAfter is the node's own silence window, from the heartbeat interval its birth says [P-HB-3].
	silentAfter  time.Duration
	heartbeatSeq uint64
	reportSeq    uint64
	datasetSeq   uint64
	apiReachable bool
	// apiBackAt is when the agent last said its node reaches the API server again after it had said it did not:
	// the API server's pods may still be what the node posted before the cut (freshAfterReconnect).
	apiBackAt time.Time
	apiKnown  bool // the agent has said whether its node reaches the API server
	// journaled is how many messages the agent's last heartbeat said wait in its journal (fleet metrics only).
	journaled uint32
	workers   map[podRef]*workerRecord
	pending   int // workers whose state is kept while the cache does not know their pod
	results   int // results waiting in Tracker.actions
	reports   int // workers whose report is kept
	datasets  int // Datasets whose count is kept
	commands  tokenBucket
}

// workerRecord is the latest accepted state of one worker, as one node reported it.
type workerRecord struct {
	state *lifelinev1.WorkerState
	seq   uint64    // the last accepted seq of the node's epoch; 0 after a new epoch began [P-BIRTH-3]
	at    time.Time // when the controller accepted the state
	// pending: the cache did not know the pod as bound to this node, with this UID, when the state arrived.
	pending bool
	// The worker episode the latest command was sent for, and when [P-CMD-5].
	commandedUID     string
	commandedEpisode uint64
	commandedAt      time.Time
}

// workerKey names a worker record: a pod as one node reports it.
type workerKey struct {
	node string
	pod  podRef
}

// pendingResult is an agent's result waiting for the reconcile of its worker's workload.
type pendingResult struct {
	result *lifelinev1.CommandResult
	node   string
	at     time.Time // when the controller accepted it
}

// Tracker ingests the agents' messages. It is safe for concurrent use.
type Tracker struct {
	Cluster string
	// SilentAfter: a node whose heartbeats stopped this long is silent (three default intervals); a node whose
	// birth says another interval gets a window in proportion [P-HB-3].
	SilentAfter time.Duration
	// Pods, when set, is the API server's word on worker pods: a node's word on another node's pod is dropped as
	// forged, results and reports are accepted only of pods bound to the reporting node, and states of pods it
	// does not know are kept only for a while [P-AUTH-3]. Without it no pod is known.
	Pods Pods
	// Datasets, when set, is the API server's word on Datasets: a node's count is accepted only of a Dataset
	// whose spec.nodeName is the node [P-DS-2]. Without it no count is accepted.
	Datasets DatasetNodes
	// Nodes, when set, is the API server's word on Nodes: only a node that is an edge Node gets a record in the
	// table, and prune forgets one that no longer is. Without it any name gets a record, up to the cap.
	Nodes EdgeNodes
	Log   logr.Logger

	// nodeCap bounds the records of nodes (maxNodes; smaller in tests).
	nodeCap int

	received  *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	throttled *prometheus.CounterVec
	panics    prometheus.Counter

	mu          sync.Mutex
	nodes       map[string]*nodeRecord
	online      map[string]bool // as last announced to subscribers
	subscribers []*subscriber
	pending     map[workerKey]bool                // worker records of pods the cache did not know
	actions     map[podRef][]pendingResult        // restarts by agents not yet taken
	sent        map[string]sentCommand            // command id -> what and when
	deferred    map[podRef]time.Time              // workers whose command a rate limit held back, and until when
	reports     map[workloadRef]map[string]Report // workload -> worker -> latest report
	datasets    map[podRef]DatasetCount           // Dataset (namespace, name) -> latest count
	loggedDrop  map[string]bool
}

// NewTracker returns a tracker whose metrics are registered with reg.
func NewTracker(cluster string, reg prometheus.Registerer, log logr.Logger) (*Tracker, error) {
	t := &Tracker{Cluster: cluster, SilentAfter: lifelinev1.SilentIntervals * lifelinev1.DefaultHeartbeatInterval, Log: log,
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_liveness_messages_total",
			Help: "Agent messages accepted, by kind."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_liveness_dropped_total",
			Help: "Agent messages and connections dropped, by reason: " + dropReasons + "."}, []string{"reason"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_liveness_commands_throttled_total",
			Help: "Commands to agents held back by a rate limit (sent later), by limit: worker, node."}, []string{"limit"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{Name: "lifeline_liveness_delivery_panics_total",
			Help: "Changes of the liveness table whose delivery to a controller panicked (and was recovered)."}),
		nodes: map[string]*nodeRecord{}, online: map[string]bool{}, pending: map[workerKey]bool{},
		actions: map[podRef][]pendingResult{}, sent: map[string]sentCommand{}, deferred: map[podRef]time.Time{},
		reports: map[workloadRef]map[string]Report{}, datasets: map[podRef]DatasetCount{}, loggedDrop: map[string]bool{},
		nodeCap: maxNodes}
	nodes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifeline_liveness_nodes",
		Help: fmt.Sprintf("Nodes the liveness table holds a record of (at most %d).", maxNodes)}, t.nodeCount)
	// Every known label value starts at zero, so that a rate or an alert reads 0 rather than nothing before the
	// first of its kind.
	for _, kind := range []lifelinev1.Kind{lifelinev1.KindBirth, lifelinev1.KindDeath, lifelinev1.KindHeartbeat,
		lifelinev1.KindWorkerState, lifelinev1.KindReport, lifelinev1.KindResult, lifelinev1.KindDataset} {
		t.received.WithLabelValues(kind.String())
	}
	for _, reason := range strings.Fields(dropReasons) {
		t.dropped.WithLabelValues(reason)
	}
	t.throttled.WithLabelValues(limitWorker)
	t.throttled.WithLabelValues(limitNode)
	// An earlier table of this process (a manager restarted in it): the new table's metrics replace its.
	if err := promreg.Register(reg, t.received, t.dropped, t.throttled, t.panics, nodes, newFleetCollector(t)); err != nil {
		return nil, fmt.Errorf("liveness: %w", err)
	}
	return t, nil
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
	case lifelinev1.KindDataset:
		msg = &lifelinev1.DatasetSamples{}
	default: // commands: the controller's own, back through its subscription to every node topic
		return
	}
	if tp.Kind == lifelinev1.KindWorkerState && len(payload) == 0 {
		t.forgetWorker(tp) // [P-WS-4]
		return
	}
	if len(payload) > maxPayloadBytes || proto.Unmarshal(payload, msg) != nil {
		t.Drop(DropDecode, topic)
		return
	}
	// What the API server says is asked before the table is locked: the cache has locks of its own.
	check, reason := t.check(tp, msg)
	if reason == "" && createsRecord(tp.Kind) && !t.mayHaveRecord(tp.Node) {
		reason = DropUnknownNode
	}
	if reason != "" {
		t.Drop(reason, topic)
		return
	}
	var changed changes
	t.mu.Lock()
	reason = t.apply(tp, msg, check, now, &changed)
	t.mu.Unlock()
	if reason != "" {
		t.Drop(reason, topic)
		return
	}
	t.received.WithLabelValues(tp.Kind.String()).Inc()
	t.notify(changed)
}

// checked is what the checks against the topic and the API server found of a message, for apply.
type checked struct {
	verified bool // a worker state of a pod the cache binds to the node, same UID
	report   *lifelinev1.Report
	kind     string // the report's workload kind and name, from its worker's pod
	owner    string
}

// check holds a message against its topic and the API server's pods, without the table; it returns a drop
// reason for a message that cannot be true whatever the table holds.
func (t *Tracker) check(tp lifelinev1.Topic, msg proto.Message) (checked, string) {
	var c checked
	switch m := msg.(type) {
	case *lifelinev1.NodeBirth:
		if m.Node != tp.Node {
			return c, DropForged
		}
	case *lifelinev1.NodeDeath:
		if m.Node != tp.Node {
			return c, DropForged
		}
	case *lifelinev1.WorkerState:
		if m.Namespace != tp.Namespace || m.Name != tp.Pod {
			return c, DropForged
		}
		info, known := t.pod(m.Namespace, m.Name)
		switch s := stateStanding(tp.Node, m.Uid, info, known); s {
		case standingForged:
			return c, DropForged
		default:
			c.verified = s == standingVerified
		}
	case *lifelinev1.CommandResult:
		info, known := t.pod(m.Namespace, m.Pod)
		if reason := resultStanding(tp.Node, m, info, known); reason != "" {
			return c, reason
		}
	case *lifelinev1.WorkerReport:
		c.report = &lifelinev1.Report{}
		if len(m.Body) > lifelinev1.MaxReportBodyBytes || json.Unmarshal(m.Body, c.report) != nil {
			return c, DropDecode
		}
		if c.report.Name != m.Worker || c.report.Namespace != m.Namespace {
			return c, DropForged
		}
		var pods []PodInfo
		if t.Pods != nil {
			pods = t.Pods.Workers(m.Namespace, m.Worker)
		}
		var reason string
		if c.kind, c.owner, reason = reportOwner(tp.Node, c.report, pods); reason != "" {
			return c, reason
		}
	case *lifelinev1.DatasetSamples:
		if reason := t.datasetStanding(tp.Node, m); reason != "" {
			return c, reason
		}
	}
	return c, ""
}

// standing is what the API server's word makes of a node's state of a pod.
type standing int

const (
	standingVerified standing = iota // the pod is bound to the node, with the state's UID
	standingPending                  // the cache does not know the pod as this node's (yet): kept for a while
	standingForged                   // the pod is bound to another node
)

// stateStanding judges a node's state of a pod by what the cache has of the pod. A pod the cache does not
// have, has not scheduled yet, or has as another incarnation (another UID, on this node) may be a new pod the
// cache has not caught up with.
func stateStanding(node, uid string, info PodInfo, known bool) standing {
	switch {
	case !known || info.Node == "":
		return standingPending
	case info.Node != node:
		return standingForged
	case info.UID != uid:
		return standingPending
	default:
		return standingVerified
	}
}

// resultStanding judges a node's result by the pod it names: the pod must be bound to the node with the
// result's UID [P-AUTH-3] [P-HEAL-2]. Whether a command's result answers a command sent is for apply.
func resultStanding(node string, m *lifelinev1.CommandResult, info PodInfo, known bool) string {
	switch {
	case !known:
		return DropUnknownPod
	case info.Node != node || info.UID != m.PodUid:
		return DropForged
	}
	return ""
}

// reportOwner finds the workload a node's report is for by the pods of its worker (by WORKER_NAME): those
// bound to the node and working for a Sedna workload. The report's own ownerName and ownerKind are no guide —
// Sedna's library sends ownerName "sedna" from a JI worker and ownerKind "default" from a trainer — so they only
// choose among several such pods' workloads; when they choose none of several, the report is dropped.
func reportOwner(node string, r *lifelinev1.Report, pods []PodInfo) (kind, owner, reason string) {
	if len(pods) == 0 {
		return "", "", DropUnknownPod
	}
	found := 0
	for _, p := range pods {
		if p.Node != node || p.OwnerKind == "" || p.OwnerName == "" || (found > 0 && p.OwnerKind == kind && p.OwnerName == owner) {
			continue
		}
		if ownerKinds[strings.ToLower(r.OwnerKind)] == p.OwnerKind && r.OwnerName == p.OwnerName {
			return p.OwnerKind, p.OwnerName, ""
		}
		kind, owner = p.OwnerKind, p.OwnerName
		found++
	}
	if found != 1 {
		return "", "", DropForged
	}
	return kind, owner, ""
}

// pod is Pods.Pod, or "not known" without Pods.
func (t *Tracker) pod(namespace, name string) (PodInfo, bool) {
	if t.Pods == nil {
		return PodInfo{}, false
	}
	return t.Pods.Pod(namespace, name)
}

// node returns the record of a node, made on its first message while the table has room.
func (t *Tracker) node(name string) *nodeRecord {
	n := t.nodes[name]
	if n == nil && len(t.nodes) < t.nodeCap {
		n = &nodeRecord{workers: map[podRef]*workerRecord{}}
		t.nodes[name] = n
	}
	return n
}

// apply updates the table with t.mu held, listing what changed; it returns a drop reason.
func (t *Tracker) apply(tp lifelinev1.Topic, msg proto.Message, c checked, now time.Time, changed *changes) string {
	n := t.nodes[tp.Node]
	switch m := msg.(type) {
	case *lifelinev1.NodeBirth:
		if n = t.node(tp.Node); n == nil {
			return DropOverflow
		}
		switch birthOrder(n, m) {
		case birthOld:
			return DropReplayed
		case birthRedelivered:
			return ""
		case birthNewEpoch: // a wiped state directory or a reboot: the node's sequences start anew [P-BIRTH-3]
			n.reportSeq, n.datasetSeq = 0, 0
			for _, w := range n.workers {
				w.seq = 0
			}
		}
		n.born, n.birthSeq, n.bootID, n.stateID, n.dead = true, m.BirthSeq, m.BootId, m.StateId, false
		n.lastHeartbeat, n.heartbeatSeq = now, 0 // the agent's heartbeats count from 1 again [P-BIRTH-3]
		n.silentAfter = t.silenceOf(m)
		if m.ApiReachable != nil { // the new session's word, not the last one's, from its first message [P-HB-1]
			n.setAPIReachable(*m.ApiReachable, now)
		}
		changed.pods = workersOf(n)
	case *lifelinev1.NodeDeath:
		switch {
		case n == nil || !n.born:
			return DropUnknown
		case m.BirthSeq < n.birthSeq:
			return DropReplayed // a late death never overrides a newer birth [P-DEATH-2]
		}
		n.dead = true
		changed.pods = workersOf(n)
	case *lifelinev1.Heartbeat:
		switch {
		case n == nil || !n.born:
			return DropUnknown
		case m.BirthSeq < n.birthSeq || (m.BirthSeq == n.birthSeq && m.Seq <= n.heartbeatSeq):
			return DropReplayed
		}
		if m.BirthSeq > n.birthSeq { // the birth was missed (QoS 1 vs 0 ordering): the heartbeat proves the session
			n.birthSeq, n.dead = m.BirthSeq, false
		}
		flipped := n.apiReachable != m.ApiReachable || n.dead
		n.setAPIReachable(m.ApiReachable, now)
		n.lastHeartbeat, n.heartbeatSeq, n.dead, n.journaled = now, m.Seq, false, m.JournalReports
		if flipped {
			changed.pods = workersOf(n)
		}
	case *lifelinev1.WorkerState:
		return t.applyState(tp.Node, m, c.verified, now, changed)
	case *lifelinev1.CommandResult:
		return t.applyResult(tp.Node, m, now, changed)
	case *lifelinev1.WorkerReport:
		return t.applyReport(tp.Node, m, c, now, changed)
	case *lifelinev1.DatasetSamples:
		return t.applyDataset(tp.Node, m, now, changed)
	}
	return ""
}

// The place of a birth among the node's births.
const (
	birthNewer       = iota // a later session of the same epoch
	birthNewEpoch           // another state directory or boot: taken whatever its seq
	birthRedelivered        // the current birth again (QoS 1): nothing to do
	birthOld                // an earlier session's
)

// birthOrder places a birth among the births the node record has seen [P-BIRTH-2] [P-BIRTH-3].
func birthOrder(n *nodeRecord, m *lifelinev1.NodeBirth) int {
	switch {
	case !n.born:
		return birthNewer
	case m.StateId != n.stateID || m.BootId != n.bootID:
		return birthNewEpoch
	case m.BirthSeq == n.birthSeq:
		return birthRedelivered
	case m.BirthSeq < n.birthSeq:
		return birthOld
	default:
		return birthNewer
	}
}

// applyState keeps a worker state, with t.mu held. Kept per node: what one node says of a pod never overwrites
// what the pod's own node says.
func (t *Tracker) applyState(node string, m *lifelinev1.WorkerState, verified bool, now time.Time, changed *changes) string {
	n := t.node(node)
	if n == nil {
		return DropOverflow
	}
	ref := podRef{m.Namespace, m.Name}
	w := n.workers[ref]
	switch {
	case w != nil && m.Seq <= w.seq:
		return DropReplayed
	case w == nil && len(n.workers) >= maxWorkersPerNode:
		return DropOverflow
	case !verified && (w == nil || !w.pending) && n.pending >= maxPendingPerNode:
		return DropOverflow
	}
	if w == nil {
		w = &workerRecord{}
		n.workers[ref] = w
	}
	t.setPending(workerKey{node, ref}, n, w, !verified)
	w.state, w.seq, w.at = m, m.Seq, now
	changed.pods = []podRef{ref}
	return ""
}

// setPending marks a worker record as waiting for the cache to know its pod, or not, with t.mu held.
func (t *Tracker) setPending(k workerKey, n *nodeRecord, w *workerRecord, pending bool) {
	switch {
	case pending && !w.pending:
		n.pending++
		t.pending[k] = true
	case !pending && w.pending:
		n.pending--
		delete(t.pending, k)
	}
	w.pending = pending
}

// forgetWorker takes an empty state, which clears the worker's retained state when it has left the node
// [P-WS-4]: the node's record of it goes too.
func (t *Tracker) forgetWorker(tp lifelinev1.Topic) {
	ref := podRef{tp.Namespace, tp.Pod}
	t.mu.Lock()
	n := t.nodes[tp.Node]
	known := n != nil && n.workers[ref] != nil
	if known {
		t.removeWorker(workerKey{tp.Node, ref}, n)
	}
	t.mu.Unlock()
	t.received.WithLabelValues("forget").Inc()
	if known {
		t.notify(changes{pods: []podRef{ref}})
	}
}

// removeWorker forgets a worker record, with t.mu held.
func (t *Tracker) removeWorker(k workerKey, n *nodeRecord) {
	if w := n.workers[k.pod]; w != nil {
		t.setPending(k, n, w, false)
		delete(n.workers, k.pod)
	}
}

// setAPIReachable takes the agent's word on its node's reach of the API server, noting when it came back.
func (n *nodeRecord) setAPIReachable(reachable bool, now time.Time) {
	if reachable && !n.apiReachable && n.apiKnown {
		n.apiBackAt = now
	}
	n.apiReachable, n.apiKnown = reachable, true
}

func workersOf(n *nodeRecord) []podRef {
	refs := make([]podRef, 0, len(n.workers))
	for ref := range n.workers {
		refs = append(refs, ref)
	}
	return refs
}

// notify tells every subscriber about what changed.
func (t *Tracker) notify(c changes) {
	if len(c.pods) == 0 && len(c.workloads) == 0 {
		return
	}
	t.mu.Lock()
	subs := t.subscribers // Subscribe only appends: the elements this slice holds never change
	t.mu.Unlock()
	for _, sub := range subs {
		sub.add(c)
	}
}

// Run watches for nodes going silent (no message arrives to say so), settles the states of pods the cache did
// not know, and wakes the workers whose commands a rate limit held back, until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.SilentAfter / 6)
	defer tick.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.tick(now)
			if now.Sub(lastPrune) >= time.Minute {
				t.prune(now)
				lastPrune = now
			}
		}
	}
}

// tick is one pass of Run's frequent work.
func (t *Tracker) tick(now time.Time) {
	t.notify(changes{pods: append(t.onlineChanges(now), t.dueCommands(now)...)})
	t.settlePending(now)
}

// settlePending looks again at the states kept for pods the cache did not know: one whose pod the cache now
// binds to its node, with its UID, is kept for good; one still unknown after pendingFor is forgotten and counted.
func (t *Tracker) settlePending(now time.Time) {
	type candidate struct {
		key   workerKey
		state *lifelinev1.WorkerState
		at    time.Time
	}
	t.mu.Lock()
	candidates := make([]candidate, 0, len(t.pending))
	for k := range t.pending {
		w := t.nodes[k.node].workers[k.pod]
		candidates = append(candidates, candidate{k, w.state, w.at})
	}
	t.mu.Unlock()
	verdicts := make([]bool, len(candidates)) // true: verified; false: expired; the others are left out
	settled := candidates[:0:0]
	for _, c := range candidates { // asked outside the lock: Pods reads the cache
		info, known := t.pod(c.key.pod.namespace, c.key.pod.name)
		if v := stateStanding(c.key.node, c.state.Uid, info, known) == standingVerified; v || now.Sub(c.at) > pendingFor {
			verdicts[len(settled)] = v
			settled = append(settled, c)
		}
	}
	var forgotten []podRef
	t.mu.Lock()
	for i, c := range settled {
		n := t.nodes[c.key.node]
		switch w := n.workers[c.key.pod]; {
		case w == nil || w.state != c.state || !w.pending: // a newer state came meanwhile, judged on its own
		case verdicts[i]:
			t.setPending(c.key, n, w, false)
		default:
			t.removeWorker(c.key, n)
			forgotten = append(forgotten, c.key.pod)
		}
	}
	t.mu.Unlock()
	t.dropped.WithLabelValues(DropUnknownPod).Add(float64(len(forgotten)))
	t.notify(changes{pods: forgotten})
}

// forgetAfter is how long the table keeps what nobody asks for any more: the states of pods that are gone from
// the API server, results no reconcile took, reports of workloads that stopped reporting.
const forgetAfter = time.Hour

// prune forgets what arrived more than forgetAfter ago (by the controller's clock, never a node's) and no longer
// matters, so the table does not grow with every pod and workload that ever was, and the nodes that are no
// longer edge Nodes (forgetGoneNodes).
func (t *Tracker) prune(now time.Time) {
	t.forgetGoneNodes(now)
	t.mu.Lock()
	var stale []workerKey
	for name, n := range t.nodes {
		for ref, w := range n.workers {
			if now.Sub(w.at) > forgetAfter {
				stale = append(stale, workerKey{name, ref})
			}
		}
	}
	t.mu.Unlock()
	var gone []workerKey
	for _, k := range stale { // asked outside the lock: Pods reads the cache
		if info, known := t.pod(k.pod.namespace, k.pod.name); !known || info.Node != k.node {
			gone = append(gone, k)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range gone {
		if n := t.nodes[k.node]; n.workers[k.pod] != nil && now.Sub(n.workers[k.pod].at) > forgetAfter {
			t.removeWorker(k, n)
		}
	}
	for ref, results := range t.actions {
		kept := results[:0]
		for _, r := range results {
			if now.Sub(r.at) > forgetAfter {
				t.nodes[r.node].results--
			} else {
				kept = append(kept, r)
			}
		}
		if len(kept) == 0 {
			delete(t.actions, ref)
		} else {
			t.actions[ref] = kept
		}
	}
	t.pruneDatasets(now)
	for owner, workers := range t.reports {
		for name, r := range workers {
			if now.Sub(r.At) > forgetAfter {
				t.nodes[r.node].reports--
				delete(workers, name)
			}
		}
		if len(workers) == 0 {
			delete(t.reports, owner)
		}
	}
	for id, c := range t.sent {
		if now.Sub(c.at) > 2*commandLifetime { // its result, if any, has long arrived
			delete(t.sent, id)
		}
	}
}

func (t *Tracker) onlineChanges(now time.Time) []podRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	var changed []podRef
	for name, n := range t.nodes {
		online := t.isOnline(n, now)
		if t.online[name] != online {
			t.online[name] = online
			changed = append(changed, workersOf(n)...)
		}
	}
	return changed
}

func (t *Tracker) isOnline(n *nodeRecord, now time.Time) bool {
	return n != nil && n.born && !n.dead && now.Sub(n.lastHeartbeat) < n.silentAfter
}

// silenceOf is the silence window of a node born with m: SilentAfter for the default heartbeat interval, in
// proportion for another [P-HB-3].
func (t *Tracker) silenceOf(m *lifelinev1.NodeBirth) time.Duration {
	return time.Duration(float64(t.SilentAfter) * float64(lifelinev1.SilentAfter(m)) /
		float64(lifelinev1.SilentIntervals*lifelinev1.DefaultHeartbeatInterval))
}
