// Package nodecondition puts what Lifeline's controller hears of each edge node's agent on the Node itself, as
// the condition LifelineAgent, the way node-problem-detector reports node problems: `kubectl describe node`,
// `kubectl get nodes -o wide` tooling, alerting on kube-state-metrics' kube_node_status_condition and every
// dashboard that reads Node conditions then show which edge nodes are cut off from the API server or silent.
package nodecondition

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// Type is the condition's type on every edge Node.
const Type corev1.NodeConditionType = "LifelineAgent"

// The condition's reasons, stable for alerts and scripts.
const (
	// ReasonConnected (True): the agent is heard and says its node reaches the API server.
	ReasonConnected = "AgentConnected"
	// ReasonAPIServerUnreachable (False): the agent is heard and says its node does not reach the API server: the
	// node's workers are told in the agent's word, and healed by it.
	ReasonAPIServerUnreachable = "APIServerUnreachable"
	// ReasonSilent (False): no heartbeat within the node's silence window: the node, its agent or its link to the
	// broker is down.
	ReasonSilent = "AgentSilent"
	// ReasonStopped (False): the agent said it stopped (its death message), and no new birth came.
	ReasonStopped = "AgentStopped"
	// ReasonNeverHeard (Unknown): no agent of this node has announced itself since the controller started.
	ReasonNeverHeard = "AgentNeverHeard"
)

// EdgeNodeLabel selects the nodes that get the condition: keadm's edge role.
const EdgeNodeLabel = "node-role.kubernetes.io/edge"

// Agents is what the controller hears of the agents (the liveness table).
type Agents interface {
	AgentOf(node string, now time.Time) liveness.AgentState
}

// Backlog is how many workload passes are queued and ready to run.
type Backlog interface {
	Len() int
}

// Writer keeps the condition of every edge Node true. It writes a Node only when the condition's status, reason
// or message changes, so the API server sees a write per transition, not per heartbeat; its heartbeat time is
// the agent's heartbeat at that transition.
type Writer struct {
	Client client.Client // reads Nodes from the manager's cache
	Agents Agents
	// Interval is how often the Nodes are compared with the table.
	Interval time.Duration
	// Rehear is how long after the writer starts a node its table has not heard of yet keeps the condition it
	// has: a new leader's table is empty until the agents reconnect to its broker, and a fleet flapping to
	// AgentNeverHeard and back at every hand-over would be a false alarm and two writes a node.
	Rehear time.Duration
	// Backlog, when set, holds writes back while workload passes are queued, for at most YieldFor: in a region's
	// outage the agents of hundreds of nodes change state at once, and the API server's writes go first to the
	// workloads' statuses, where users and controllers read their workers' state; the Nodes' conditions follow.
	Backlog  Backlog
	YieldFor time.Duration
	Now      func() time.Time
	Log      logr.Logger
	// NeverHeard, when set, is told after each pass how many edge Nodes' agents the table has never heard: the
	// table knows only the nodes that spoke, the writer every edge Node (lifeline_edge_agents_never_heard).
	NeverHeard interface{ Set(float64) }

	started       time.Time
	yieldingSince time.Time // when the writer first held a write back for the backlog; zero when it holds none
}

// Start compares and writes every Interval until ctx ends (a manager.Runnable: the leader's alone).
func (w *Writer) Start(ctx context.Context) error {
	w.started = w.Now()
	tick := time.NewTicker(w.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := w.Sync(ctx); err != nil {
				w.Log.Error(err, "setting the edge nodes' LifelineAgent condition")
			}
		}
	}
}

// Sync writes the condition of every edge Node whose condition is not what the table says.
func (w *Writer) Sync(ctx context.Context) error {
	nodes := &corev1.NodeList{}
	// The cache's Nodes, not copies, every second: only read, and written by patches.
	if err := w.Client.List(ctx, nodes, client.HasLabels{EdgeNodeLabel}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing edge nodes: %w", err)
	}
	now := w.Now()
	var firstErr error
	neverHeard := 0
	for i := range nodes.Items {
		node := &nodes.Items[i]
		agent := w.Agents.AgentOf(node.Name, now)
		if !agent.Heard {
			neverHeard++
		}
		want := Condition(agent, now)
		have := find(node.Status.Conditions)
		if have != nil && (same(*have, want) || !agent.Heard && now.Sub(w.started) < w.Rehear) {
			continue
		}
		if w.yields(now) {
			return firstErr // the count waits for a whole pass
		}
		if have != nil && have.Status == want.Status {
			want.LastTransitionTime = have.LastTransitionTime // another reason, the same status
		}
		if err := w.write(ctx, node.Name, want); err != nil && firstErr == nil {
			firstErr = err
		}
		w.Log.V(1).Info("LifelineAgent condition", "node", node.Name, "status", want.Status, "reason", want.Reason)
	}
	w.yieldingSince = time.Time{}
	if w.NeverHeard != nil {
		w.NeverHeard.Set(float64(neverHeard))
	}
	return firstErr
}

// yields tells whether the next write waits for the workload passes queued: while there are any, for at most
// YieldFor from the first write it held back.
func (w *Writer) yields(now time.Time) bool {
	if w.Backlog == nil || w.Backlog.Len() == 0 {
		w.yieldingSince = time.Time{}
		return false
	}
	if w.yieldingSince.IsZero() {
		w.yieldingSince = now
	}
	return now.Sub(w.yieldingSince) < w.YieldFor
}

// Condition is the node's condition for what the table holds of its agent at now. Pure.
func Condition(a liveness.AgentState, now time.Time) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: Type, LastTransitionTime: metav1.NewTime(now), LastHeartbeatTime: metav1.NewTime(now)}
	if !a.LastHeartbeat.IsZero() {
		c.LastHeartbeatTime = metav1.NewTime(a.LastHeartbeat)
	}
	switch a.Status() {
	case liveness.AgentNeverHeard:
		c.Status, c.Reason = corev1.ConditionUnknown, ReasonNeverHeard
		c.Message = "no Lifeline agent of this node has announced itself to the controller: the node's workers are in the API server's word"
	case liveness.AgentStopped:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonStopped
		c.Message = "the node's Lifeline agent said it stopped: the node's workers are in the API server's word until it is back"
	case liveness.AgentSilent:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonSilent
		c.Message = "no heartbeat from the node's Lifeline agent: the node, the agent or its link to the broker is down; the node's workers are in the API server's word"
	case liveness.AgentCutOff:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonAPIServerUnreachable
		c.Message = "the node's Lifeline agent is heard and says the node does not reach the API server: the node's workers are in the agent's word, and healed by it"
	default:
		c.Status, c.Reason = corev1.ConditionTrue, ReasonConnected
		c.Message = "the node's Lifeline agent is heard and the node reaches the API server"
	}
	if a.OversizedWorkers > 0 && a.Online {
		c.Message += fmt.Sprintf("; %d of the node's workers get no offline healing: their pods are beyond the agent's size bounds (its log names them)",
			a.OversizedWorkers)
	}
	return c
}

func find(conds []corev1.NodeCondition) *corev1.NodeCondition {
	for i := range conds {
		if conds[i].Type == Type {
			return &conds[i]
		}
	}
	return nil
}

// same tells whether a condition already says what want says.
func same(have, want corev1.NodeCondition) bool {
	return have.Status == want.Status && have.Reason == want.Reason && have.Message == want.Message
}

// write patches the node's status with the condition alone: conditions merge by type, so the kubelet's (and
// any other component's) stay as they are.
func (w *Writer) write(ctx context.Context, node string, c corev1.NodeCondition) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		return err
	}
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := w.Client.Status().Patch(ctx, obj, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		return fmt.Errorf("patching node %s's LifelineAgent condition: %w", node, err)
	}
	return nil
}
