package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/desired"
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
	actedThisEpisode    bool          // this death was restarted or rebuilt already, by a command or locally
}

// shouldHeal is the offline policy rule: restart a worker that is dead, stays dead, and that nobody else can
// restart — the API server is out of reach and the controller either is too or has not acted in time — once
// per death: the node's kubelet restarts it under its own back-off after a stop, so acting again on the same
// death only stops it again.
func shouldHeal(t HealTiming, c healCase) bool {
	switch {
	case c.policy == OfflinePolicyNone, !c.dead, c.actedThisEpisode:
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
	// Rebuilder, when set, brings back a worker the node will never run again (its pod lost, or failed under
	// restartPolicy Never) while the API server is out of reach, and hands it back once the API server is there
	// again. Without it the healer only reports.
	Rebuilder Rebuilder
	// Publisher, when set, receives a result per local restart, so the cloud learns what happened offline.
	Publisher Publisher
	// Episodes, shared with the command handler, makes one action per death whoever asks; nil: the healer's own.
	Episodes *Episodes
	Timing   HealTiming
	Log      logr.Logger

	mu       sync.Mutex
	deadFrom map[string]death     // uid -> its current down episode; absent while up
	healedAt map[string]time.Time // uid -> last local restart
	apiDown  time.Time            // zero while the API server is reachable
	tidied   bool                 // static pods left by an earlier life of the agent were handed back
}

// death is a worker seen down: its containers failed or exited, or its pod is gone from the node.
type death struct {
	since   time.Time
	phase   lifelinev1.Phase
	episode uint64
}

// Rebuilder runs a worker again from its last known pod when the node lost the pod, and gives the workers
// back to the node's API-driven pods when the API server returns.
type Rebuilder interface {
	Rebuild(ctx context.Context, namespace, pod, uid string) error
	Release() (int, error)
}

// Observed takes each published worker state (the observer's OnPublished).
func (h *Healer) Observed(ws *lifelinev1.WorkerState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.deadFrom == nil {
		h.deadFrom = map[string]death{}
	}
	if !workerDown(ws.Phase) {
		delete(h.deadFrom, ws.Uid)
		return
	}
	d, already := h.deadFrom[ws.Uid]
	if !already || d.episode != ws.Episode || d.phase != ws.Phase {
		since := time.Unix(0, ws.ObservedUnixNano)
		if already && d.episode == ws.Episode {
			since = d.since // still the same death, seen differently (failed, then gone)
		}
		h.deadFrom[ws.Uid] = death{since: since, phase: ws.Phase, episode: ws.Episode}
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

// HealOnce restarts (or rebuilds) every worker the rule selects now, and hands rebuilt workers back once the
// API server is reachable again.
func (h *Healer) HealOnce(ctx context.Context, now time.Time) {
	due, release := h.due(now)
	if release {
		if n, err := h.Rebuilder.Release(); err != nil {
			h.Log.Error(err, "removing the static pods of rebuilt workers")
		} else if n > 0 {
			h.Log.Info("the API server is back: rebuilt workers handed back to their pods", "count", n)
		}
	}
	for _, d := range due {
		w, action := d.worker, "rebuilt as a static pod"
		err := h.Rebuilder.Rebuild(ctx, w.Namespace, w.Name, w.UID)
		outcome, message := lifelinev1.Outcome_OUTCOME_DONE, action+" by the offline policy"
		if err != nil {
			h.episodes().Release(w.UID, d.episode) // tried again after the cooldown
			outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, err.Error()
			h.Log.Error(err, "healing a worker by its offline policy", "worker", w.Namespace+"/"+w.Name, "action", action)
		} else {
			h.Log.Info("healed a worker by its offline policy", "worker", w.Namespace+"/"+w.Name, "uid", w.UID, "action", action, "episode", d.episode)
		}
		h.publish(w, now, outcome, message)
	}
}

// episodes is the shared ledger, or the healer's own.
func (h *Healer) episodes() *Episodes {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Episodes == nil {
		h.Episodes = &Episodes{}
	}
	return h.Episodes
}

// dueWorker is a worker to rebuild now.
type dueWorker struct {
	worker  desired.Worker
	episode uint64
}

// due picks the workers to heal and marks them healed; release says the API server came back and rebuilt
// workers are to be handed back.
func (h *Healer) due(now time.Time) (due []dueWorker, release bool) {
	reachable := h.APIReachable()
	controller := h.ControllerReachable != nil && h.ControllerReachable()
	workers := h.Workers.Workers()
	episodes := h.episodes()
	known := make(map[string]bool, len(workers))
	for _, w := range workers {
		known[w.UID] = true
	}
	episodes.Retain(func(uid string) bool { return known[uid] })
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.healedAt == nil {
		h.healedAt = map[string]time.Time{}
	}
	for uid := range h.healedAt {
		if !known[uid] {
			delete(h.healedAt, uid)
		}
	}
	for uid := range h.deadFrom {
		if !known[uid] {
			delete(h.deadFrom, uid)
		}
	}
	switch {
	case reachable:
		// Back from a cut (or just started): static pods stand in for no one any more.
		release = h.Rebuilder != nil && (!h.apiDown.IsZero() || !h.tidied)
		h.apiDown, h.tidied = time.Time{}, true
		return nil, release // the API server's side acts
	case h.apiDown.IsZero():
		h.apiDown = now
	}
	for _, w := range workers {
		c := healCase{policy: w.OfflinePolicy, controllerReachable: controller}
		d, down := h.deadFrom[w.UID]
		// Only what the node will never run again; the rest it restarts under its crash back-off, and an exit 0
		// under OnFailure or Never is completion [P-HEAL-1].
		if down && lifelinev1.NodeNeverRunsAgain(d.phase, w.RestartPolicy) && h.Rebuilder != nil {
			c.dead, c.deadFor = true, now.Sub(d.since)
			c.actedThisEpisode = episodes.Acted(w.UID, d.episode)
		}
		c.apiDownFor = max(now.Sub(h.apiDown), time.Nanosecond)
		if at, ok := h.healedAt[w.UID]; ok {
			c.sinceLastHeal = max(now.Sub(at), time.Nanosecond)
		}
		if shouldHeal(h.Timing, c) && episodes.Claim(w.UID, d.episode) {
			h.healedAt[w.UID] = now
			due = append(due, dueWorker{worker: w, episode: d.episode})
		}
	}
	return due, false
}

// publish reports a local action as a result naming the worker, marked local [P-HEAL-2]; its id only needs to
// be unique.
func (h *Healer) publish(w desired.Worker, now time.Time, outcome lifelinev1.Outcome, message string) {
	if h.Publisher == nil {
		return
	}
	res := &lifelinev1.CommandResult{CommandId: fmt.Sprintf("local/%s/%d", w.UID, now.UnixNano()), Outcome: outcome,
		Message: message, Namespace: w.Namespace, Pod: w.Name, PodUid: w.UID, Local: true}
	if err := publishResult(h.Publisher, h.Cluster, h.Node, res); err != nil {
		h.Log.Error(err, "journaling a local restart", "worker", w.Namespace+"/"+w.Name)
	}
}
