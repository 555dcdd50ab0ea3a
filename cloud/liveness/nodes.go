package liveness

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// EdgeNodes is the tracker's window on the API server's Nodes (the manager's cache; the broker's CacheNodes
// implements it).
type EdgeNodes interface {
	// IsEdgeNode tells whether a Node of that name exists and is an edge node; an error is neither yes nor no.
	IsEdgeNode(ctx context.Context, name string) (bool, error)
}

// createsRecord tells whether a message of kind makes a record for a node the table does not know: the others
// need a birth first.
func createsRecord(kind lifelinev1.Kind) bool {
	return kind == lifelinev1.KindBirth || kind == lifelinev1.KindWorkerState || kind == lifelinev1.KindResult
}

// mayHaveRecord tells whether node may have a record in the table: it has one already (it was an edge Node when it
// got it, and ForgetNode or prune take it away when it no longer is), or the API server has an edge Node of its
// name. Asked before the table is locked: the cache has locks of its own. A lookup that fails counts as yes: a
// birth dropped would leave a live node offline until its agent reconnects, while the cap still bounds the table
// and prune forgets the record if the node turns out to be none.
func (t *Tracker) mayHaveRecord(node string) bool {
	if t.Nodes == nil {
		return true
	}
	t.mu.Lock()
	known := t.nodes[node] != nil
	t.mu.Unlock()
	if known {
		return true
	}
	edge, err := t.isEdgeNode(node)
	return edge || err != nil
}

func (t *Tracker) isEdgeNode(node string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), nodeLookupTimeout)
	defer cancel()
	return t.Nodes.IsEdgeNode(ctx, node)
}

// ForgetNode forgets everything the table holds of a node — its record, its workers' states, its results,
// reports and Dataset counts, the commands sent to it — when its Node is deleted or stops being an edge Node, so
// the table is bounded by the cluster's edge Nodes rather than by every name it ever saw. The workloads of its
// workers are woken: what the agent said of them no longer counts, the API server's word does. The caller ends
// the node's broker session first, so the agent announces itself anew should the Node come back.
func (t *Tracker) ForgetNode(name string) {
	t.mu.Lock()
	changed := t.forgetNode(name)
	t.mu.Unlock()
	t.notify(changed)
}

// forgetNode is ForgetNode with t.mu held; it returns what changed.
func (t *Tracker) forgetNode(name string) changes {
	n := t.nodes[name]
	if n == nil { // nothing else of a node is kept without its record
		return changes{}
	}
	var changed changes
	changed.pods = workersOf(n)
	for _, ref := range changed.pods {
		t.removeWorker(workerKey{name, ref}, n)
	}
	delete(t.nodes, name)
	delete(t.online, name)
	for ref, results := range t.actions {
		kept := results[:0]
		for _, r := range results {
			if r.node != name {
				kept = append(kept, r)
			}
		}
		switch {
		case len(kept) == len(results):
			continue
		case len(kept) == 0:
			delete(t.actions, ref)
		default:
			t.actions[ref] = kept
		}
		changed.pods = append(changed.pods, ref)
	}
	for owner, workers := range t.reports {
		had := len(workers)
		for worker, r := range workers {
			if r.node == name {
				delete(workers, worker)
			}
		}
		if len(workers) != had {
			changed.workloads = append(changed.workloads, owner)
		}
		if len(workers) == 0 {
			delete(t.reports, owner)
		}
	}
	for ref, c := range t.datasets {
		if c.node == name {
			delete(t.datasets, ref)
			changed.workloads = append(changed.workloads, workloadRef{DatasetKind, ref.namespace, ref.name})
		}
	}
	for id, c := range t.sent {
		if c.node == name {
			delete(t.sent, id)
		}
	}
	return changed
}

// forgetGoneNodes forgets the nodes that are no longer edge Nodes, in case the event of their Node's deletion
// (or loss of the edge label) was missed: a watch that lagged, a replica that was not the leader yet. Only
// silent ones: an agent still heard — through an external broker, which does not end its session — would never
// announce itself again, should its Node come back, once its record was gone. A lookup that fails keeps the node.
func (t *Tracker) forgetGoneNodes(now time.Time) {
	if t.Nodes == nil {
		return
	}
	t.mu.Lock()
	var silent []string
	for name, n := range t.nodes {
		if !t.isOnline(n, now) {
			silent = append(silent, name)
		}
	}
	t.mu.Unlock()
	var changed changes
	for _, name := range silent { // asked outside the lock: Nodes reads the cache
		if edge, err := t.isEdgeNode(name); edge || err != nil {
			continue
		}
		t.mu.Lock()
		if n := t.nodes[name]; n != nil && !t.isOnline(n, now) {
			c := t.forgetNode(name)
			changed.pods, changed.workloads = append(changed.pods, c.pods...), append(changed.workloads, c.workloads...)
		}
		t.mu.Unlock()
	}
	t.notify(changed)
}

// nodeCount is how many nodes the table holds a record of, for the nodes gauge.
func (t *Tracker) nodeCount() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return float64(len(t.nodes))
}

// AgentState is what the table holds of a node's agent.
type AgentState struct {
	// Heard: a birth of the node's agent arrived (and the node is still an edge Node).
	Heard bool
	// BirthSeq is the birth of the agent's current session [P-BIRTH-2].
	BirthSeq uint64
	// Stopped: the agent's current birth ended with its death message.
	Stopped bool
	// Online: heard, not stopped, and a heartbeat within the node's silence window.
	Online bool
	// APIKnown: the agent has said whether its node reaches the API server; APIReachable is what it said.
	APIKnown, APIReachable bool
	// LastHeartbeat is when its latest heartbeat (or birth) arrived.
	LastHeartbeat time.Time
	// OversizedWorkers is how many of the node's workers its agent said get no stand-in: their pods are beyond
	// the agent's size bounds, so they are not healed offline.
	OversizedWorkers int
}

// maxOversized bounds what one node's heartbeat may claim of its oversized workers: an agent keeps at most 1,024
// workers, and a node that claims more only says it has many.
const maxOversized = 1024

// AgentStatus is what an AgentState comes to, for the Node condition and the fleet's metrics alike.
type AgentStatus string

// The statuses of an agent.
const (
	AgentNeverHeard AgentStatus = "never_heard" // no birth arrived
	AgentStopped    AgentStatus = "stopped"     // its current birth ended with its death message
	AgentSilent     AgentStatus = "silent"      // no heartbeat within the node's silence window
	AgentCutOff     AgentStatus = "cut_off"     // heard, and says its node does not reach the API server
	AgentConnected  AgentStatus = "connected"   // heard, and has not said its node is cut off
)

// Status is what the state comes to.
func (a AgentState) Status() AgentStatus {
	switch {
	case !a.Heard:
		return AgentNeverHeard
	case a.Stopped:
		return AgentStopped
	case !a.Online:
		return AgentSilent
	case a.APIKnown && !a.APIReachable:
		return AgentCutOff
	}
	return AgentConnected
}

// AgentOf is what the table holds of node's agent at now.
func (t *Tracker) AgentOf(node string, now time.Time) AgentState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.agentState(t.nodes[node], now)
}

// agentState is what the record n holds of its agent at now; t.mu is held.
func (t *Tracker) agentState(n *nodeRecord, now time.Time) AgentState {
	if n == nil || !n.born {
		return AgentState{}
	}
	return AgentState{Heard: true, BirthSeq: n.birthSeq, Stopped: n.dead, Online: t.isOnline(n, now), APIKnown: n.apiKnown, APIReachable: n.apiReachable,
		LastHeartbeat: n.lastHeartbeat, OversizedWorkers: int(n.oversized)}
}

// fleetCollector exports, at each scrape, how many edge nodes are in each state and how many workers the agents
// of cut-off nodes report failed or gone: the alerts' inputs, bounded in cardinality whatever the fleet's size.
type fleetCollector struct {
	t                                      *Tracker
	nodes, downOnCut, journaled, oversized *prometheus.Desc
}

func newFleetCollector(t *Tracker) *fleetCollector {
	return &fleetCollector{t: t,
		nodes: prometheus.NewDesc("lifeline_edge_nodes",
			"Edge nodes whose agent the controller has heard, by state: connected (heard, reaching the API server), "+
				"cut_off (heard, not reaching it), silent (no heartbeat within the node's window), stopped (said it stopped).",
			[]string{"state"}, nil),
		downOnCut: prometheus.NewDesc("lifeline_edge_cut_off_workers_down",
			"Workers that the agents of nodes cut off from the API server report failed or gone.", nil, nil),
		journaled: prometheus.NewDesc("lifeline_edge_journal_reports",
			"Messages waiting in the journals of the agents heard (connected or cut off), as their last heartbeats said.", nil, nil),
		oversized: prometheus.NewDesc("lifeline_edge_oversized_workers",
			"Workers that the agents heard (connected or cut off) keep no stand-in for, their pods beyond the agent's size bounds, "+
				"as their last heartbeats said: those workers are not healed offline.", nil, nil)}
}

// Describe sends the collector's descriptions.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.nodes
	ch <- c.downOnCut
	ch <- c.journaled
	ch <- c.oversized
}

// Collect counts the table now.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	counts := map[AgentStatus]float64{AgentConnected: 0, AgentCutOff: 0, AgentSilent: 0, AgentStopped: 0}
	down, journaled, oversized := 0.0, 0.0, 0.0
	c.t.mu.Lock()
	for _, n := range c.t.nodes {
		status := c.t.agentState(n, now).Status()
		if status == AgentNeverHeard {
			continue
		}
		counts[status]++
		if status == AgentConnected || status == AgentCutOff {
			journaled += float64(n.journaled)
			oversized += float64(n.oversized)
		}
		if status != AgentCutOff {
			continue
		}
		for _, w := range n.workers {
			if w.state != nil && (w.state.Phase == lifelinev1.Phase_PHASE_FAILED || w.state.Phase == lifelinev1.Phase_PHASE_GONE) {
				down++
			}
		}
	}
	c.t.mu.Unlock()
	for status, v := range counts {
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, v, string(status))
	}
	ch <- prometheus.MustNewConstMetric(c.downOnCut, prometheus.GaugeValue, down)
	ch <- prometheus.MustNewConstMetric(c.journaled, prometheus.GaugeValue, journaled)
	ch <- prometheus.MustNewConstMetric(c.oversized, prometheus.GaugeValue, oversized)
}
