package liveness

import (
	"context"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

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
