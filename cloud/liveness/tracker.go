// Package liveness is the controller's view of the edge as its agents report it over MQTT: a table of nodes
// (online, birth sequence, last heartbeat, whether the node reaches the API server), of workers (state, seq,
// last seen, latest Sedna report) and of Dataset counts, each message checked against the API server's pods; the
// merge rule that says whose word is the truth for a worker; and the fenced restart commands the controller sends
// to an agent whose node is cut off from the API server. The workload controllers read it through
// cloud/edgeaware.
package liveness

import (
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
	// oversized is how many of the node's workers its agent's last heartbeat said get no stand-in, their pods
	// beyond the agent's size bounds (the Node condition's message and fleet metrics only).
	oversized uint32
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
	// OnSession, when set, is called with a node's name when its agent begins a session (a new birth, or a
	// heartbeat of a birth that was missed); set it before the tracker ingests.
	OnSession func(node string)
	Log       logr.Logger

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
