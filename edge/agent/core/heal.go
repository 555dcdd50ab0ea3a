package core

import (
	"time"

	"github.com/lifeline-edge/lifeline/edge/desired"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// OfflinePolicyNone is the offline policy that only reports; any other value (or none) rebuilds.
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

// Tick applies the workers' offline policies: while the node is cut off from the API server it rebuilds the
// workers the node will never run again [P-HEAL-1] [P-HEAL-3]; once the API server is reachable again (or at
// the first tick of the agent's life) it hands rebuilt workers back to their pods.
func (c *Core) Tick(env Env, workers []desired.Worker) []Action {
	c.clock(env)
	c.setDesired(workers)
	if env.APIReachable {
		// Back from a cut (or just started): static pods stand in for no one any more.
		release := c.cfg.CanRebuild && (!c.apiDown.IsZero() || !c.tidied)
		c.apiDown, c.tidied = time.Time{}, true
		if release {
			return []Action{{Op: c.op(pending{kind: Release}), Kind: Release}}
		}
		return nil // the API server's side acts
	}
	if c.apiDown.IsZero() {
		c.apiDown = env.Now
	}
	var out []Action
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
