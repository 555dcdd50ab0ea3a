package core

import (
	"time"

	"github.com/lifeline-edge/lifeline/edge/desired"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

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
	// Cooldown between two local rebuilds of the same worker.
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

// shouldHeal is the offline policy rule: act on a worker that is dead, stays dead, and that nobody else can
// bring back — the API server is out of reach and the controller either is too or has not acted in time — once
// per death.
func shouldHeal(t HealTiming, c healCase) bool {
	switch {
	case c.policy == lifelinev1.OfflinePolicyNone, !c.dead, c.actedThisEpisode:
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

// Tick applies the workers' offline policies: while the node is cut off from the API server it rebuilds the
// workers the node will never run again [P-HEAL-1] [P-HEAL-3]; it hands each rebuilt worker back once its own
// pod or its replacement runs (handBack).
func (c *Core) Tick(env Env, workers []desired.Worker) []Action {
	c.clock(env)
	c.setDesired(workers)
	if env.APIReachable {
		c.apiDown = time.Time{}
		return c.handBack(env) // the API server's side acts
	}
	if c.apiDown.IsZero() {
		c.apiDown = env.Now
	}
	out := c.handBack(env)
	for _, w := range workers {
		hc := healCase{policy: w.OfflinePolicy, controllerReachable: env.BrokerUp}
		d, down := c.deaths[w.UID]
		// Only what the node will never run again; the rest it restarts under its crash back-off, and an exit 0
		// under OnFailure or Never is completion [P-HEAL-1].
		if down && lifelinev1.NodeNeverRunsAgain(d.phase, w.RestartPolicy) && c.cfg.CanRebuild {
			hc.dead, hc.deadFor = true, env.Now.Sub(d.since)
			got, ok := c.acted[w.UID]
			hc.actedThisEpisode = ok && got == d.episode
		}
		hc.apiDownFor = max(env.Now.Sub(c.apiDown), time.Nanosecond)
		if at, ok := c.healedAt[w.UID]; ok {
			hc.sinceLastHeal = max(env.Now.Sub(at), time.Nanosecond)
		}
		if shouldHeal(c.cfg.Timing, hc) && c.claimEpisode(w.UID, d.episode) {
			c.healedAt[w.UID] = env.Now
			out = append(out, Action{Op: c.op(pending{kind: Rebuild, worker: w, episode: d.episode, local: true}), Kind: Rebuild,
				Namespace: w.Namespace, Name: w.Name, UID: w.UID, Local: true})
		}
	}
	return out
}

// healed reports a local rebuild as a result marked local, naming its worker [P-HEAL-2]; a failed one may be
// tried again after the cooldown.
func (c *Core) healed(env Env, p pending, err error) []Action {
	outcome, message := lifelinev1.Outcome_OUTCOME_DONE, "rebuilt as a static pod by the offline policy"
	if err != nil {
		c.releaseEpisode(p.worker.UID, p.episode)
		outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, err.Error()
	}
	w := p.worker
	return []Action{c.sendResult(env, &lifelinev1.CommandResult{CommandId: lifelinev1.LocalResultID(w.UID, env.Now), Outcome: outcome,
		Message: message, Namespace: w.Namespace, Pod: w.Name, PodUid: w.UID, Local: true, Epoch: p.episode})}
}

// unwantedGrace is how long the API server must want no pod of a stand-in's worker before the stand-in goes: a
// controller replacing a pod deletes it before it creates the next, and the node's watch sees the gap.
const unwantedGrace = 10 * time.Second

// handBack releases the stand-ins whose work is over: the worker's own pod, or the pod that replaces it, runs
// (then at once, cut off or not: two would run); or, with the API server back, the API server has wanted no pod
// of that worker on the node for unwantedGrace. Until then the stand-in keeps running, however long, so the
// worker is never without an instance: a pod the node lost while cut off may never be sent to it again (its
// object did not change), and only a running instance of the worker is worth giving way to.
func (c *Core) handBack(env Env) []Action {
	var out []Action
	present := map[string]bool{}
	for _, s := range env.StandIns {
		key := s.Namespace + "/" + s.Pod
		present[key] = true
		release := c.podOfRuns(s)
		if !release && env.APIReachable {
			if c.wanted(s) {
				delete(c.unwanted, key)
			} else if _, ok := c.unwanted[key]; !ok {
				c.unwanted[key] = env.Now
			}
			since, unwanted := c.unwanted[key]
			release = unwanted && env.Now.Sub(since) >= unwantedGrace
		}
		if release {
			out = append(out, Action{Op: c.op(pending{kind: Release}), Kind: Release, Namespace: s.Namespace, Name: s.Pod})
		}
	}
	for key := range c.unwanted {
		if !present[key] {
			delete(c.unwanted, key)
		}
	}
	return out
}

// podOfRuns: a pod of the stand-in's worker (its own, or one of the same WORKER_NAME) runs on the node.
func (c *Core) podOfRuns(s StandIn) bool {
	for _, w := range c.workers {
		if w.namespace != s.Namespace || w.last == nil || w.last.Phase != lifelinev1.Phase_PHASE_RUNNING {
			continue
		}
		if d, ok := c.desired[w.last.Uid]; ok && (d.Name == s.Pod || s.WorkerName != "" && d.WorkerName == s.WorkerName) {
			return true
		}
	}
	return false
}

// wanted: the API server still binds a pod of the stand-in's worker to the node.
func (c *Core) wanted(s StandIn) bool {
	for _, d := range c.desired {
		if d.Namespace == s.Namespace && (d.Name == s.Pod || s.WorkerName != "" && d.WorkerName == s.WorkerName) {
			return true
		}
	}
	return false
}
