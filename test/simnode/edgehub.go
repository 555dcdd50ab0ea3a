package simnode

import (
	"sync"
	"time"
)

// edgehub imitates, when asked to (Node.ImitateEdgehub), the moment edged's mirror-pod request for a static pod
// ends. edged creates a static pod's mirror pod before it starts its containers; the request goes through
// metamanager to edgehub as a synchronous message. While edgehub takes its link to cloudcore as working, the
// request waits for the cloud's answer up to beehive's timeout (KubeEdge source: edge/pkg/metamanager/client/
// metaclient.go, syncMsgRespTimeout, 1 min; measured on the rig: the container started 60.6 s after the request);
// once edgehub knows the link is down, metamanager refuses it at once ("not connected", process.go
// processInsert). edgehub noticed a cut 1.4 to 9.8 s after it began on the rig. Off by default: a static pod then
// starts at once, as before.
//
// It also imitates, when asked to (Node.ImitateEdgehubReconnect), edgehub's reconnect cycle: once it took its link
// as broken it tries again only every retry cycle (about 55 s on the rig), so a link that works again is used at
// the next attempt, not at once. Until then the node posts no pod status and no Node heartbeat, and the MetaServer
// answers from the node's store, as edged and metamanager do behind a disconnected edgehub.
type edgehub struct {
	mu sync.Mutex
	// noticeAfter is how long after the node's link to the cloud broke edgehub takes itself as disconnected;
	// mirrorTimeout how long a mirror-pod request waits meanwhile (0: the imitation is off).
	noticeAfter, mirrorTimeout time.Duration
	// lostAt is when the node's link to the cloud last broke; zero while it works.
	lostAt time.Time

	// retryCycle is how often a disconnected edgehub tries again (0: the imitation is off: it reconnects as soon
	// as the link works).
	retryCycle time.Duration
	// down: edgehub is disconnected, trying again every retryCycle from downSince; backAt is when the link was
	// first seen working again meanwhile (zero: not yet).
	down              bool
	downSince, backAt time.Time
}

// linked records whether the node's own list and watch of the API server work.
func (e *edgehub) linked(ok bool, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case ok:
		e.lostAt = time.Time{}
	case e.lostAt.IsZero():
		e.lostAt = now
	}
}

// connected tells whether edgehub is connected now, given whether the node's link to the cloud works: with the
// reconnect cycle imitated, a disconnected edgehub reconnects at its first attempt after the link works again.
func (e *edgehub) connected(linkWorks bool, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.retryCycle == 0:
		e.down = false
		return linkWorks
	case !linkWorks:
		if !e.down {
			e.down, e.downSince = true, now
		}
		e.backAt = time.Time{}
		return false
	case !e.down:
		return true
	}
	if e.backAt.IsZero() {
		e.backAt = now
	}
	attempts := max(1, (e.backAt.Sub(e.downSince)+e.retryCycle-1)/e.retryCycle)
	if now.Before(e.downSince.Add(attempts * e.retryCycle)) {
		return false
	}
	e.down = false
	return true
}

// mirrorPodWait is how long a static pod added now waits for its mirror-pod request before its containers start.
func (e *edgehub) mirrorPodWait(now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mirrorTimeout == 0 || e.lostAt.IsZero() || now.Sub(e.lostAt) >= e.noticeAfter {
		return 0 // the request reaches the cloud, or edgehub refuses it at once
	}
	return e.mirrorTimeout
}

// ImitateEdgehub turns on (mirrorTimeout > 0) or off the imitation of edgehub's late notice of a cut and of the
// wait it makes a static pod's mirror-pod request meanwhile.
func (n *Node) ImitateEdgehub(noticeAfter, mirrorTimeout time.Duration) {
	n.hub.mu.Lock()
	defer n.hub.mu.Unlock()
	n.hub.noticeAfter, n.hub.mirrorTimeout = noticeAfter, mirrorTimeout
}

// ImitateEdgehubReconnect turns on (retryCycle > 0) or off the imitation of edgehub's reconnect cycle.
func (n *Node) ImitateEdgehubReconnect(retryCycle time.Duration) {
	n.hub.mu.Lock()
	defer n.hub.mu.Unlock()
	n.hub.retryCycle = retryCycle
}
