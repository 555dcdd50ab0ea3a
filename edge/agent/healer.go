package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// OfflinePolicyNone is the offline policy that only reports; any other value (or none) restarts.
const OfflinePolicyNone = "None"

// HealTiming is when the offline policy acts [P-HEAL-1].
type HealTiming struct {
	// APIGrace: the API server must be out of reach this long first; before that the node's own machinery and
	// the controller are trusted to act.
	APIGrace time.Duration
	// DeadFor: a worker must stay dead this long (it may come back by itself).
	DeadFor time.Duration
	// ControllerWait: while the broker session is up the controller decides; the agent acts alone once a worker
	// has been dead this long without a command.
	ControllerWait time.Duration
	// Cooldown between two local restarts of the same worker.
	Cooldown time.Duration
}

// DefaultHealTiming is the agent's default.
var DefaultHealTiming = HealTiming{APIGrace: 5 * time.Second, DeadFor: time.Second, ControllerWait: 5 * time.Second, Cooldown: 10 * time.Second}

// healCase is what the rule looks at for one worker.
type healCase struct {
	policy              string
	dead                bool
	deadFor             time.Duration
	apiDownFor          time.Duration // 0 while the API server is reachable
	controllerReachable bool
	sinceLastHeal       time.Duration // 0 when never healed
}

// shouldHeal is the offline policy rule: restart a worker that is dead, stays dead, and that nobody else can
// restart — the API server is out of reach and the controller either is too or has not acted in time.
func shouldHeal(t HealTiming, c healCase) bool {
	switch {
	case c.policy == OfflinePolicyNone, !c.dead:
		return false
	case c.apiDownFor == 0 || c.apiDownFor < t.APIGrace:
		return false
	case c.deadFor < t.DeadFor:
		return false
	case c.controllerReachable && c.deadFor < t.ControllerWait:
		return false
	case c.sinceLastHeal != 0 && c.sinceLastHeal < t.Cooldown:
		return false
	}
	return true
}

// DesiredWorkers are the workers that belong on the node.
type DesiredWorkers interface {
	Workers() []desired.Worker
}

// Healer applies the workers' offline policies while the node is cut off from the API server.
type Healer struct {
	Cluster, Node string
	Workers       DesiredWorkers
	APIReachable  func() bool
	// ControllerReachable tells whether the broker session is up (the controller can send commands).
	ControllerReachable func() bool
	Actuator            Actuator
	// Publisher, when set, receives a result per local restart, so the cloud learns what happened offline.
	Publisher Publisher
	Timing    HealTiming
	Log       logr.Logger

	mu       sync.Mutex
	deadFrom map[string]time.Time // uid -> when its worker was first seen dead; absent while alive
	healedAt map[string]time.Time // uid -> last local restart
	apiDown  time.Time            // zero while the API server is reachable
}

// Observed takes each published worker state (the observer's OnPublished).
func (h *Healer) Observed(ws *lifelinev1.WorkerState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.deadFrom == nil {
		h.deadFrom = map[string]time.Time{}
	}
	if ws.Phase != lifelinev1.Phase_PHASE_FAILED {
		delete(h.deadFrom, ws.Uid)
		return
	}
	if _, already := h.deadFrom[ws.Uid]; !already {
		h.deadFrom[ws.Uid] = time.Unix(0, ws.ObservedUnixNano)
	}
}

// Run checks every interval until ctx ends.
func (h *Healer) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			h.HealOnce(ctx, now)
		}
	}
}

// HealOnce restarts every worker the rule selects now.
func (h *Healer) HealOnce(ctx context.Context, now time.Time) {
	for _, w := range h.due(now) {
		err := h.Actuator.Restart(ctx, w.Namespace, w.Name, w.UID)
		outcome, message := lifelinev1.Outcome_OUTCOME_DONE, "restarted by the offline policy"
		if err != nil {
			outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, err.Error()
			h.Log.Error(err, "restarting a worker by its offline policy", "worker", w.Namespace+"/"+w.Name)
		} else {
			h.Log.Info("restarted a worker by its offline policy", "worker", w.Namespace+"/"+w.Name, "uid", w.UID)
		}
		h.publish(w, now, outcome, message)
	}
}

// due picks the workers to restart and marks them healed.
func (h *Healer) due(now time.Time) []desired.Worker {
	reachable := h.APIReachable()
	controller := h.ControllerReachable != nil && h.ControllerReachable()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.healedAt == nil {
		h.healedAt = map[string]time.Time{}
	}
	switch {
	case reachable:
		h.apiDown = time.Time{}
		return nil // the API server's side acts: nothing to look at
	case h.apiDown.IsZero():
		h.apiDown = now
	}
	var out []desired.Worker
	for _, w := range h.Workers.Workers() {
		c := healCase{policy: w.OfflinePolicy, controllerReachable: controller}
		if from, dead := h.deadFrom[w.UID]; dead {
			c.dead, c.deadFor = true, now.Sub(from)
		}
		if !h.apiDown.IsZero() {
			c.apiDownFor = max(now.Sub(h.apiDown), time.Nanosecond)
		}
		if at, ok := h.healedAt[w.UID]; ok {
			c.sinceLastHeal = max(now.Sub(at), time.Nanosecond)
		}
		if shouldHeal(h.Timing, c) {
			h.healedAt[w.UID] = now
			out = append(out, w)
		}
	}
	return out
}

// publish reports a local restart as a command result with a "local/" id [P-HEAL-2].
func (h *Healer) publish(w desired.Worker, now time.Time, outcome lifelinev1.Outcome, message string) {
	if h.Publisher == nil {
		return
	}
	payload, err := proto.Marshal(&lifelinev1.CommandResult{CommandId: fmt.Sprintf("local/%s/%s/%s/%d", w.Namespace, w.Name, w.UID, now.UnixNano()),
		Outcome: outcome, Message: message, BirthSeq: h.Publisher.BirthSeq(), TimeUnixNano: now.UnixNano()})
	if err != nil {
		return
	}
	topic := lifelinev1.NodeTopic(h.Cluster, h.Node, lifelinev1.KindResult).String()
	if err := h.Publisher.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1}); err != nil {
		h.Log.Error(err, "journaling a local restart")
	}
}
