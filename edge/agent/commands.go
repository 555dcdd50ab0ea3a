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

// workerRecord is what the command handler knows of a worker: the identity and the seq of its latest state.
type workerRecord struct {
	uid string
	seq uint64
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
	Now    func() time.Time

	mu      sync.Mutex
	workers map[string]workerRecord // namespace/pod -> latest published state
	claimed map[string]bool         // used when Claims is nil
}

// Observed records the latest state published for a worker; commands are fenced against it.
func (c *Commands) Observed(ws *lifelinev1.WorkerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers == nil {
		c.workers = map[string]workerRecord{}
	}
	c.workers[ws.Namespace+"/"+ws.Name] = workerRecord{uid: ws.Uid, seq: ws.Seq}
}

// Handle decodes a command payload, decides, acts, and publishes exactly one result. A payload that does not
// decode is dropped (there is no id to answer) and reported as an error [P-BAD-1].
func (c *Commands) Handle(ctx context.Context, payload []byte) error {
	cmd := &lifelinev1.Command{}
	if err := proto.Unmarshal(payload, cmd); err != nil || cmd.Id == "" {
		return fmt.Errorf("dropping a malformed command (%d bytes): %v", len(payload), err)
	}
	now := c.now()
	c.mu.Lock()
	outcome, message := c.decide(cmd, now)
	c.mu.Unlock()
	if outcome == lifelinev1.Outcome_OUTCOME_DONE {
		// Claimed before acting: at most once, even if the agent dies while acting.
		fresh, err := c.claim(cmd, now)
		switch {
		case err != nil:
			outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, fmt.Sprintf("recording the command: %v", err)
		case !fresh:
			outcome, message = lifelinev1.Outcome_OUTCOME_DUPLICATE, "command already executed"
		default:
			var err error
			if cmd.Action == lifelinev1.Action_ACTION_REBUILD {
				err, message = c.Rebuilder.Rebuild(ctx, cmd.Namespace, cmd.Pod, cmd.PodUid), "rebuilt as a static pod"
			} else {
				err = c.Actuator.Restart(ctx, cmd.Namespace, cmd.Pod, cmd.PodUid)
			}
			if err != nil {
				outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, err.Error()
			}
		}
	}
	return c.publishResult(cmd.Id, outcome, message)
}

func (c *Commands) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Commands) claim(cmd *lifelinev1.Command, now time.Time) (bool, error) {
	forget := now.Add(24 * time.Hour)
	if cmd.TtlMillis != 0 {
		forget = now.Add(time.Duration(cmd.TtlMillis) * time.Millisecond)
	}
	if c.Claims != nil {
		return c.Claims.ClaimCommand(cmd.Id, forget, now)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.claimed == nil {
		c.claimed = map[string]bool{}
	}
	if c.claimed[cmd.Id] {
		return false, nil
	}
	c.claimed[cmd.Id] = true
	return true, nil
}

// decide is the fencing rule, with c.mu held.
func (c *Commands) decide(cmd *lifelinev1.Command, now time.Time) (lifelinev1.Outcome, string) {
	w, known := c.workers[cmd.Namespace+"/"+cmd.Pod]
	switch {
	case cmd.TtlMillis == 0:
		return lifelinev1.Outcome_OUTCOME_REFUSED_EXPIRED, "command expired"
	case cmd.Action != lifelinev1.Action_ACTION_RESTART && (cmd.Action != lifelinev1.Action_ACTION_REBUILD || c.Rebuilder == nil):
		return lifelinev1.Outcome_OUTCOME_FAILED, fmt.Sprintf("action %s is not supported by this agent", cmd.Action)
	case !known || w.uid != cmd.PodUid:
		return lifelinev1.Outcome_OUTCOME_REFUSED_STALE, fmt.Sprintf("pod %s/%s with uid %s is not on this node", cmd.Namespace, cmd.Pod, cmd.PodUid)
	case cmd.Epoch < w.seq:
		return lifelinev1.Outcome_OUTCOME_REFUSED_STALE, fmt.Sprintf("epoch %d is older than the worker's state %d", cmd.Epoch, w.seq)
	default:
		return lifelinev1.Outcome_OUTCOME_DONE, "restarted"
	}
}

func (c *Commands) publishResult(id string, outcome lifelinev1.Outcome, message string) error {
	payload, err := proto.Marshal(&lifelinev1.CommandResult{CommandId: id, Outcome: outcome, Message: message,
		BirthSeq: c.Publisher.BirthSeq(), TimeUnixNano: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	topic := lifelinev1.NodeTopic(c.Cluster, c.Node, lifelinev1.KindResult).String()
	return c.Publisher.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1})
}
