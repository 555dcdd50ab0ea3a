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

// Commands executes fenced commands from the controller [P-CMD-1..4].
type Commands struct {
	Cluster, Node string
	Actuator      Actuator
	Publisher     Publisher
	Now           func() time.Time

	mu      sync.Mutex
	workers map[string]workerRecord // namespace/pod -> latest published state
	seen    map[string]lifelinev1.Outcome
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
	c.mu.Lock()
	outcome, message := c.decide(cmd)
	if outcome == lifelinev1.Outcome_OUTCOME_DONE {
		c.seen[cmd.Id] = lifelinev1.Outcome_OUTCOME_DONE // claimed before acting: at most once
	}
	c.mu.Unlock()
	if outcome == lifelinev1.Outcome_OUTCOME_DONE {
		if err := c.Actuator.Restart(ctx, cmd.Namespace, cmd.Pod, cmd.PodUid); err != nil {
			outcome, message = lifelinev1.Outcome_OUTCOME_FAILED, err.Error()
		}
	}
	return c.publishResult(cmd.Id, outcome, message)
}

// decide is the fencing rule, with c.mu held.
func (c *Commands) decide(cmd *lifelinev1.Command) (lifelinev1.Outcome, string) {
	if c.seen == nil {
		c.seen = map[string]lifelinev1.Outcome{}
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	w, known := c.workers[cmd.Namespace+"/"+cmd.Pod]
	switch {
	case c.seen[cmd.Id] != lifelinev1.Outcome_OUTCOME_UNSPECIFIED:
		return lifelinev1.Outcome_OUTCOME_DUPLICATE, "command already executed"
	case cmd.ExpiresUnixNano != 0 && now.UnixNano() > cmd.ExpiresUnixNano:
		return lifelinev1.Outcome_OUTCOME_REFUSED_EXPIRED, "command expired"
	case cmd.Action != lifelinev1.Action_ACTION_RESTART:
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
