package liveness

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Commands are what the tracker sends to agents.
type Commands interface {
	PublishCommand(node string, payload []byte) error
}

// sentCommand is a command the tracker sent, to recognise its result.
type sentCommand struct {
	node     string
	pod      podRef
	uid      string
	at       time.Time
	answered bool // its one result arrived [P-CMD-4]
}

// The lifetime and the rate limits of commands [P-CMD-3] [P-CMD-5].
const (
	// commandLifetime is how long after receiving a command an agent may act on it.
	commandLifetime = 30 * time.Second
	// commandSpacing: at most one command per worker this often, whatever its episodes.
	commandSpacing = 10 * time.Second
	// A node gets commands from a token bucket: nodeCommandBurst at once, nodeCommandRate per second after.
	nodeCommandBurst = 10
	nodeCommandRate  = 2.0
)

// Rate limits, the values of the throttled-commands metric's limit label.
const (
	limitWorker = "worker"
	limitNode   = "node"
)

// tokenBucket is a node's allowance of commands; the zero value is full.
type tokenBucket struct {
	tokens float64
	at     time.Time // when tokens was counted; zero: never used
}

// commandGate decides whether a command for a worker last commanded at lastSent may go now, on the node's
// bucket: it returns the bucket after, and "" when it may go, or the limit that holds it back and when to ask
// again.
func commandGate(lastSent time.Time, bucket tokenBucket, now time.Time) (tokenBucket, string, time.Time) {
	if !lastSent.IsZero() && now.Sub(lastSent) < commandSpacing {
		return bucket, limitWorker, lastSent.Add(commandSpacing)
	}
	tokens := float64(nodeCommandBurst)
	if !bucket.at.IsZero() {
		tokens = min(tokens, bucket.tokens+max(0, now.Sub(bucket.at).Seconds())*nodeCommandRate)
	}
	if tokens < 1 {
		wait := time.Duration((1 - tokens) / nodeCommandRate * float64(time.Second))
		return tokenBucket{tokens: tokens, at: now}, limitNode, now.Add(wait)
	}
	return tokenBucket{tokens: tokens - 1, at: now}, "", time.Time{}
}

// healAction is what a worker the agent reports in phase needs, under its pod's restart policy: a rebuild when
// the node will never run it again — it lost the pod, or the containers failed under restartPolicy Never — and
// nothing otherwise. A worker that failed under Always or OnFailure, or exited 0 under Always, is restarted by
// the node itself under its crash back-off, and a restart through the MetaServer only stops containers: it
// cannot bring the worker back sooner, and one that lands after the node's own restart kills the fresh
// container and costs a back-off step [P-CMD-6]. A worker that succeeded under OnFailure or Never has completed.
func healAction(phase lifelinev1.Phase, policy corev1.RestartPolicy) (lifelinev1.Action, bool) {
	if lifelinev1.NodeNeverRunsAgain(phase, string(policy)) {
		return lifelinev1.Action_ACTION_REBUILD, true
	}
	return lifelinev1.Action_ACTION_UNSPECIFIED, false
}

// HealDead sends a fenced command to the agent of a worker that its agent reports down while its node is cut
// off from the API server (see healAction), when policyHeals: the caller tells whether the worker's offline
// policy lets the agent heal it. One command per worker episode: the id and the epoch are the state's episode,
// which a dead worker keeps however many states it publishes, so a death is answered once [P-CMD-5]. Commands
// are rate-limited per worker and per node; a command held back is not lost: the worker is woken when the limit
// lets it go. It returns the id of a command it sent now, or "".
func (t *Tracker) HealDead(out Commands, pod *corev1.Pod, v View, policyHeals bool, now time.Time) (string, error) {
	if out == nil || v.Truth != TruthAgent || !policyHeals {
		return "", nil
	}
	action, heal := healAction(v.State.Phase, pod.Spec.RestartPolicy)
	if !heal {
		return "", nil
	}
	uid, episode, ref := string(pod.UID), v.State.Episode, podRef{pod.Namespace, pod.Name}
	id := lifelinev1.CommandID(action, uid, episode)
	t.mu.Lock()
	n := t.nodes[pod.Spec.NodeName]
	var w *workerRecord
	if n != nil {
		w = n.workers[ref]
	}
	if w == nil || (w.commandedUID == uid && w.commandedEpisode == episode) {
		t.mu.Unlock()
		return "", nil
	}
	bucket, limit, retry := commandGate(w.commandedAt, n.commands, now)
	if limit != "" {
		n.commands, t.deferred[ref] = bucket, retry
		t.mu.Unlock()
		t.throttled.WithLabelValues(limit).Inc()
		return "", nil
	}
	prevUID, prevEpisode, prevAt, prevBucket := w.commandedUID, w.commandedEpisode, w.commandedAt, n.commands
	n.commands = bucket
	w.commandedUID, w.commandedEpisode, w.commandedAt = uid, episode, now
	t.sent[id] = sentCommand{node: pod.Spec.NodeName, pod: ref, uid: uid, at: now}
	delete(t.deferred, ref)
	t.mu.Unlock()
	payload, err := proto.Marshal(&lifelinev1.Command{Id: id, Namespace: pod.Namespace, Pod: pod.Name, PodUid: uid,
		Epoch: episode, Action: action, TtlMillis: uint32(commandLifetime / time.Millisecond)})
	if err == nil {
		err = out.PublishCommand(pod.Spec.NodeName, payload)
	}
	if err != nil { // not sent: the next reconcile tries again
		t.mu.Lock()
		delete(t.sent, id)
		if w.commandedUID == uid && w.commandedEpisode == episode && w.commandedAt.Equal(now) { // no later command since
			w.commandedUID, w.commandedEpisode, w.commandedAt, n.commands = prevUID, prevEpisode, prevAt, prevBucket
		}
		t.mu.Unlock()
		return "", fmt.Errorf("publishing %s of %s/%s: %w", id, pod.Namespace, pod.Name, err)
	}
	return id, nil
}

// dueCommands returns the workers whose command a rate limit held back until now, to wake them.
func (t *Tracker) dueCommands(now time.Time) []podRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	var due []podRef
	for ref, at := range t.deferred {
		if !now.Before(at) {
			due = append(due, ref)
			delete(t.deferred, ref)
		}
	}
	return due
}

// applyResult keeps an agent's result for the reconcile of its worker, with t.mu held. A command's result must
// answer a command sent to that node for that pod, once; a local one stands on the pod check alone (check).
func (t *Tracker) applyResult(node string, m *lifelinev1.CommandResult, now time.Time, changed *changes) string {
	n := t.node(node)
	if n == nil {
		return DropOverflow
	}
	ref := podRef{m.Namespace, m.Pod}
	if !m.Local {
		c, ok := t.sent[m.CommandId]
		switch {
		case !ok || c.node != node || c.pod != ref || c.uid != m.PodUid:
			return DropForged
		case c.answered:
			return DropReplayed
		}
		c.answered = true
		t.sent[m.CommandId] = c
	}
	if n.results >= maxResultsPerNode {
		return DropOverflow
	}
	if w := n.workers[ref]; m.Local && m.Outcome == lifelinev1.Outcome_OUTCOME_DONE && w != nil && m.Epoch != 0 {
		// The agent healed this death alone: it is acted on, as if commanded [P-HEAL-2].
		w.commandedUID, w.commandedEpisode, w.commandedAt = m.PodUid, m.Epoch, now
	}
	n.results++
	t.actions[ref] = append(t.actions[ref], pendingResult{result: m, node: node, at: now})
	changed.pods = []podRef{ref}
	return ""
}

// TakeActions returns, once, what agents reported doing to the worker pod (restarts on command or by the
// offline policy), oldest first.
func (t *Tracker) TakeActions(namespace, pod string) []*lifelinev1.CommandResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	ref := podRef{namespace, pod}
	pending := t.actions[ref]
	if len(pending) == 0 {
		return nil
	}
	delete(t.actions, ref)
	out := make([]*lifelinev1.CommandResult, 0, len(pending))
	for _, r := range pending {
		t.nodes[r.node].results--
		out = append(out, r.result)
	}
	return out
}
