package liveness

import (
	"time"

	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

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
		changed.pods, changed.born = workersOf(n), tp.Node
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
			n.birthSeq, n.dead, changed.born = m.BirthSeq, false, tp.Node
		}
		flipped := n.apiReachable != m.ApiReachable || n.dead
		n.setAPIReachable(m.ApiReachable, now)
		n.lastHeartbeat, n.heartbeatSeq, n.dead, n.journaled = now, m.Seq, false, m.JournalReports
		n.oversized = min(m.OversizedWorkers, maxOversized)
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
	if c.born != "" && t.OnSession != nil {
		t.OnSession(c.born)
	}
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
