package core

import (
	"errors"
	"fmt"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Command takes a decoded command from the controller [P-CMD-1..4]: it is fenced against the worker's latest
// state, claimed durably, executed, and answered by exactly one result.
func (c *Core) Command(env Env, cmd *lifelinev1.Command) []Action {
	c.clock(env)
	outcome, message := c.fence(cmd)
	if outcome != lifelinev1.Outcome_OUTCOME_DONE {
		return []Action{c.result(env, cmd, outcome, message)}
	}
	for id, until := range c.claims {
		if until.Before(env.Now) {
			delete(c.claims, id)
		}
	}
	if _, ok := c.claims[cmd.Id]; ok {
		return []Action{c.result(env, cmd, lifelinev1.Outcome_OUTCOME_DUPLICATE, "command already executed")}
	}
	// Its lifetime runs from its receipt, on the agent's clock: the controller's clock never enters [P-CMD-3].
	until := env.Now.Add(time.Duration(cmd.TtlMillis) * time.Millisecond)
	c.claims[cmd.Id] = until
	// Claimed before acting: at most once, even if the agent dies while acting.
	return []Action{{Op: c.op(pending{kind: ClaimCommand, cmd: cmd}), Kind: ClaimCommand, Namespace: cmd.Namespace, Name: cmd.Pod,
		UID: cmd.PodUid, CommandID: cmd.Id, Until: until, At: env.Now}}
}

// fence is the fencing rule. A command acts on the worker's current episode only: one whose epoch is another
// episode was decided on a worker that has since come back, or died again [P-CMD-2].
func (c *Core) fence(cmd *lifelinev1.Command) (lifelinev1.Outcome, string) {
	w := c.workers[cmd.Namespace+"/"+cmd.Pod]
	switch {
	case cmd.TtlMillis == 0:
		return lifelinev1.Outcome_OUTCOME_REFUSED_EXPIRED, "command expired"
	case cmd.Action != lifelinev1.Action_ACTION_RESTART && (cmd.Action != lifelinev1.Action_ACTION_REBUILD || !c.cfg.CanRebuild):
		return lifelinev1.Outcome_OUTCOME_FAILED, fmt.Sprintf("action %s is not supported by this agent", cmd.Action)
	case w == nil || !w.fenceKnown || w.fenceUID != cmd.PodUid:
		return lifelinev1.Outcome_OUTCOME_REFUSED_STALE, fmt.Sprintf("pod %s/%s with uid %s is not on this node", cmd.Namespace, cmd.Pod, cmd.PodUid)
	case cmd.Epoch != w.fenceEp:
		return lifelinev1.Outcome_OUTCOME_REFUSED_STALE, fmt.Sprintf("epoch %d is not the worker's current episode %d", cmd.Epoch, w.fenceEp)
	}
	return lifelinev1.Outcome_OUTCOME_DONE, ""
}

func (c *Core) claimed(env Env, p pending, err error) []Action {
	cmd := p.cmd
	switch {
	case errors.Is(err, ErrAlreadyClaimed):
		return []Action{c.result(env, cmd, lifelinev1.Outcome_OUTCOME_DUPLICATE, "command already executed")}
	case err != nil:
		delete(c.claims, cmd.Id)
		return []Action{c.result(env, cmd, lifelinev1.Outcome_OUTCOME_FAILED, fmt.Sprintf("recording the command: %v", err))}
	case !c.claimEpisode(cmd.PodUid, cmd.Epoch):
		// One action per death, whoever asks: the offline policy or another command acted on it already.
		return []Action{c.result(env, cmd, lifelinev1.Outcome_OUTCOME_DUPLICATE,
			fmt.Sprintf("the agent already acted on episode %d of the worker", cmd.Epoch))}
	}
	kind := Restart
	if cmd.Action == lifelinev1.Action_ACTION_REBUILD {
		kind = Rebuild
	}
	return []Action{{Op: c.op(pending{kind: kind, cmd: cmd, episode: cmd.Epoch}), Kind: kind, Namespace: cmd.Namespace, Name: cmd.Pod, UID: cmd.PodUid}}
}

func (c *Core) commandActed(env Env, p pending, err error) []Action {
	if err != nil {
		c.releaseEpisode(p.cmd.PodUid, p.episode)
		return []Action{c.result(env, p.cmd, lifelinev1.Outcome_OUTCOME_FAILED, err.Error())}
	}
	message := "restarted"
	if p.kind == Rebuild {
		message = "rebuilt as a static pod"
	}
	return []Action{c.result(env, p.cmd, lifelinev1.Outcome_OUTCOME_DONE, message)}
}

// claimEpisode records an action on the worker in that episode, before acting; false: one was taken already.
func (c *Core) claimEpisode(uid string, ep uint64) bool {
	if got, ok := c.acted[uid]; ok && got == ep {
		return false
	}
	c.acted[uid] = ep
	return true
}

// releaseEpisode forgets a claim whose action failed, so the episode may be acted on again.
func (c *Core) releaseEpisode(uid string, ep uint64) {
	if got, ok := c.acted[uid]; ok && got == ep {
		delete(c.acted, uid)
	}
}

// result answers a command, naming its worker [P-CMD-4].
func (c *Core) result(env Env, cmd *lifelinev1.Command, outcome lifelinev1.Outcome, message string) Action {
	return c.sendResult(env, &lifelinev1.CommandResult{CommandId: cmd.Id, Outcome: outcome, Message: message,
		Namespace: cmd.Namespace, Pod: cmd.Pod, PodUid: cmd.PodUid})
}

// sendResult stamps a result with the session and the time.
func (c *Core) sendResult(env Env, res *lifelinev1.CommandResult) Action {
	res.BirthSeq, res.TimeUnixNano = env.BirthSeq, env.Now.UnixNano()
	return Action{Op: c.op(pending{kind: SendResult}), Kind: SendResult, Namespace: res.Namespace, Name: res.Pod, UID: res.PodUid, Result: res}
}
