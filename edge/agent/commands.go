package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Actuator carries out an action on a worker; the CRI-backed one stops the worker's containers so the node's
// runtime restarts them.
type Actuator interface {
	Restart(ctx context.Context, namespace, pod, uid string) error
}

// workerRecord is what the command handler knows of a worker: its pod UID and current episode.
type workerRecord struct {
	uid     string
	episode uint64
}

// Claims remembers which command ids were executed; the journal keeps them on disk so an agent restart does not
// execute a redelivered command again [P-CMD-3].
type Claims interface {
	ClaimCommand(id string, forgetAfter, now time.Time) (bool, error)
}

// Commands executes fenced commands from the controller [P-CMD-1..4].
type Commands struct {
	Cluster, Node string
	Actuator      Actuator
	// Rebuilder, when set, executes ACTION_REBUILD; without it a rebuild is answered OUTCOME_FAILED.
	Rebuilder Rebuilder
	Publisher Publisher
	// Claims, when nil, are kept in memory for the life of the process.
	Claims Claims
	// Episodes, shared with the healer, makes one action per death whoever asks; nil: the handler's own.
	Episodes *Episodes
	// Now is the agent's clock; a command's lifetime runs from its receipt on it.
	Now func() time.Time

	mu      sync.Mutex
	workers map[string]workerRecord // namespace/pod -> latest published state
	claimed map[string]time.Time    // id -> when it may be forgotten; used when Claims is nil
}

// Observed records the latest state published for a worker; commands are fenced against it.
func (c *Commands) Observed(ws *lifelinev1.WorkerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers == nil {
		c.workers = map[string]workerRecord{}
	}
	c.workers[ws.Namespace+"/"+ws.Name] = workerRecord{uid: ws.Uid, episode: ws.Episode}
}

// Forget drops a worker the observer forgot (the observer's OnForgotten): a command for it is refused as not on
// this node, and the handler holds only the node's workers.
func (c *Commands) Forget(namespace, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.workers, namespace+"/"+name)
}

// Handle decodes a command payload, decides, acts, and publishes exactly one result. A payload that does not
// decode is dropped (there is no id to answer) and reported as an error [P-BAD-1].
func (c *Commands) Handle(ctx context.Context, payload []byte) error {
	cmd := &lifelinev1.Command{}
	if err := proto.Unmarshal(payload, cmd); err != nil || cmd.Id == "" {
		return fmt.Errorf("dropping a malformed command (%d bytes): %v", len(payload), err)
	}
	received := c.now()
	c.mu.Lock()
	outcome, message := c.decide(cmd)
	if c.Episodes == nil {
		c.Episodes = &Episodes{}
	}
	episodes := c.Episodes
	c.mu.Unlock()
	if outcome == lifelinev1.Outcome_OUTCOME_DONE {
		// Claimed before acting: at most once, even if the agent dies while acting.
		fresh, err := c.claim(cmd, received)
		switch {
		case err != nil:
			outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, fmt.Sprintf("recording the command: %v", err)
		case !fresh:
			outcome, message = lifelinev1.Outcome_OUTCOME_DUPLICATE, "command already executed"
		case !episodes.Claim(cmd.PodUid, cmd.Epoch):
			outcome, message = lifelinev1.Outcome_OUTCOME_DUPLICATE, fmt.Sprintf("the agent already acted on episode %d of the worker", cmd.Epoch)
		default:
			var err error
			if cmd.Action == lifelinev1.Action_ACTION_REBUILD {
				err, message = c.Rebuilder.Rebuild(ctx, cmd.Namespace, cmd.Pod, cmd.PodUid), "rebuilt as a static pod"
			} else {
				err = c.Actuator.Restart(ctx, cmd.Namespace, cmd.Pod, cmd.PodUid)
			}
			if err != nil {
				episodes.Release(cmd.PodUid, cmd.Epoch)
				outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, err.Error()
			}
		}
	}
	return c.publishResult(cmd, outcome, message)
}

func (c *Commands) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// claim records the command id until its lifetime ends, measured from its receipt on the agent's clock: the
// controller's clock never enters [P-CMD-3].
func (c *Commands) claim(cmd *lifelinev1.Command, received time.Time) (bool, error) {
	forget := received.Add(time.Duration(cmd.TtlMillis) * time.Millisecond)
	if c.Claims != nil {
		return c.Claims.ClaimCommand(cmd.Id, forget, received)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.claimed == nil {
		c.claimed = map[string]time.Time{}
	}
	if _, ok := c.claimed[cmd.Id]; ok {
		return false, nil
	}
	for id, until := range c.claimed {
		if until.Before(received) {
			delete(c.claimed, id)
		}
	}
	c.claimed[cmd.Id] = forget
	return true, nil
}

// decide is the fencing rule, with c.mu held. A command acts on the worker's current episode only: one whose
// epoch is another episode was decided on a worker that has since come back, or died again [P-CMD-2].
func (c *Commands) decide(cmd *lifelinev1.Command) (lifelinev1.Outcome, string) {
	w, known := c.workers[cmd.Namespace+"/"+cmd.Pod]
	switch {
	case cmd.TtlMillis == 0:
		return lifelinev1.Outcome_OUTCOME_REFUSED_EXPIRED, "command expired"
	case cmd.Action != lifelinev1.Action_ACTION_RESTART && (cmd.Action != lifelinev1.Action_ACTION_REBUILD || c.Rebuilder == nil):
		return lifelinev1.Outcome_OUTCOME_FAILED, fmt.Sprintf("action %s is not supported by this agent", cmd.Action)
	case !known || w.uid != cmd.PodUid:
		return lifelinev1.Outcome_OUTCOME_REFUSED_STALE, fmt.Sprintf("pod %s/%s with uid %s is not on this node", cmd.Namespace, cmd.Pod, cmd.PodUid)
	case cmd.Epoch != w.episode:
		return lifelinev1.Outcome_OUTCOME_REFUSED_STALE, fmt.Sprintf("epoch %d is not the worker's current episode %d", cmd.Epoch, w.episode)
	default:
		return lifelinev1.Outcome_OUTCOME_DONE, "restarted"
	}
}

// publishResult answers a command, naming its worker [P-CMD-4].
func (c *Commands) publishResult(cmd *lifelinev1.Command, outcome lifelinev1.Outcome, message string) error {
	return publishResult(c.Publisher, c.Cluster, c.Node, &lifelinev1.CommandResult{CommandId: cmd.Id, Outcome: outcome,
		Message: message, Namespace: cmd.Namespace, Pod: cmd.Pod, PodUid: cmd.PodUid})
}

// publishResult journals a result on the node's results topic, stamped with the session and the time.
func publishResult(p Publisher, cluster, node string, res *lifelinev1.CommandResult) error {
	res.BirthSeq, res.TimeUnixNano = p.BirthSeq(), time.Now().UnixNano()
	payload, err := proto.Marshal(res)
	if err != nil {
		return fmt.Errorf("encoding the result of %s: %w", res.CommandId, err)
	}
	topic := lifelinev1.NodeTopic(cluster, node, lifelinev1.KindResult).String()
	return p.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1})
}
