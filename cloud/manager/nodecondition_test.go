package manager_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// Each edge Node carries its agent's state as the condition LifelineAgent, beside the kubelet's own conditions,
// which stay as they are; it is written at each transition, not at each heartbeat.
func TestEdgeNodesCarryTheirAgentsStateAsACondition(t *testing.T) {
	ca := testkit.NewCA(t, "kubeedge")
	c := startController(t, ca)
	createNode(t, "edge-cond", map[string]string{broker.EdgeNodeLabel: ""})
	createNode(t, "cloud-cond", map[string]string{"node-role.kubernetes.io/worker": ""})
	// The kubelet's Ready condition, which the controller's patches must leave alone.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ready := &corev1.Node{}
		if err := kube.Get(context.Background(), client.ObjectKey{Name: "edge-cond"}, ready); err != nil {
			return err
		}
		ready.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		return kube.Status().Update(context.Background(), ready)
	})
	if err != nil {
		t.Fatal(err)
	}

	condition := func(name string) (*corev1.NodeCondition, *corev1.Node) {
		node := &corev1.Node{}
		if err := kube.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
			t.Fatal(err)
		}
		for i := range node.Status.Conditions {
			if node.Status.Conditions[i].Type == nodecondition.Type {
				return &node.Status.Conditions[i], node
			}
		}
		return nil, node
	}
	waitCondition := func(status corev1.ConditionStatus, reason string) *corev1.Node {
		t.Helper()
		var node *corev1.Node
		testkit.Until(t, 10*time.Second, "edge-cond's LifelineAgent "+reason, func() bool {
			var cond *corev1.NodeCondition
			cond, node = condition("edge-cond")
			return cond != nil && cond.Status == status && cond.Reason == reason
		})
		return node
	}
	waitCondition(corev1.ConditionUnknown, nodecondition.ReasonNeverHeard)
	// The never-connected alert's input counts it (the liveness table knows only the nodes that spoke).
	var neverHeard float64
	testkit.Until(t, 10*time.Second, "lifeline_edge_agents_never_heard counting edge-cond", func() bool {
		neverHeard = gathered(t, "lifeline_edge_agents_never_heard")
		return neverHeard >= 1
	})

	var agent mqtt.Client
	testkit.Until(t, 10*time.Second, "edge-cond admitted", func() bool {
		cl, _, err := c.login(t, "edge-cond", nodeCert(t, ca, "edge-cond"))
		agent = cl
		return err == nil
	})
	publish := func(kind lifelinev1.Kind, m proto.Message) {
		t.Helper()
		payload, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if tok := agent.Publish(lifelinev1.NodeTopic("c", "edge-cond", kind).String(), 1, false, payload); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("publishing %v: %v", kind, tok.Error())
		}
	}
	reachable := true
	publish(lifelinev1.KindBirth, &lifelinev1.NodeBirth{Node: "edge-cond", BirthSeq: 1, StateId: "state", BootId: "boot", ApiReachable: &reachable})
	seq := uint64(0)
	// heartbeat returns once the controller's table took the heartbeat in.
	heartbeat := func(apiReachable bool) {
		t.Helper()
		heard := heartbeatsHeard(t)
		seq++
		publish(lifelinev1.KindHeartbeat, &lifelinev1.Heartbeat{BirthSeq: 1, Seq: seq, TimeUnixNano: time.Now().UnixNano(), ApiReachable: apiReachable})
		testkit.Until(t, 10*time.Second, fmt.Sprintf("heartbeat %d taken in", seq), func() bool { return heartbeatsHeard(t) > heard })
	}
	// writerPass returns after a pass of the condition writer that began after it was called: the pass that
	// first lists a new edge Node writes the Node's condition; the writer's passes run one after the other.
	witnesses := 0
	writerPass := func() {
		t.Helper()
		witnesses++
		witness := fmt.Sprintf("edge-cond-witness-%d", witnesses)
		createNode(t, witness, map[string]string{broker.EdgeNodeLabel: ""})
		testkit.Until(t, 10*time.Second, "a pass of the condition writer over "+witness, func() bool {
			cond, _ := condition(witness)
			return cond != nil
		})
	}
	heartbeat(true)
	waitCondition(corev1.ConditionTrue, nodecondition.ReasonConnected)
	testkit.Until(t, 10*time.Second, "edge-cond no longer counted as never heard", func() bool {
		return gathered(t, "lifeline_edge_agents_never_heard") == neverHeard-1
	})
	first, _ := condition("edge-cond")

	// Heartbeats that change nothing write nothing: a write would carry the latest heartbeat's time, over a
	// writer's period after the condition's. They come a little apart, as an agent's do, across the writer's
	// passes: a pass sees the first, a later one the fifth, and the one after began once that one had ended.
	heartbeat(true)
	writerPass()
	for range 4 {
		heartbeat(true)
	}
	writerPass()
	writerPass()
	if now, _ := condition("edge-cond"); !now.LastHeartbeatTime.Equal(&first.LastHeartbeatTime) {
		t.Errorf("edge-cond's condition was written again on heartbeats that changed nothing: %+v, then %+v", first, now)
	}

	heartbeat(false)
	node := waitCondition(corev1.ConditionFalse, nodecondition.ReasonAPIServerUnreachable)
	kubelet := false
	for _, cond := range node.Status.Conditions {
		kubelet = kubelet || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && cond.Reason == "KubeletReady"
	}
	if !kubelet {
		t.Errorf("the kubelet's Ready condition is gone: %+v", node.Status.Conditions)
	}
	// No heartbeat for the node's silence window (three default intervals).
	waitCondition(corev1.ConditionFalse, nodecondition.ReasonSilent)

	if cond, _ := condition("cloud-cond"); cond != nil {
		t.Errorf("a Node that is not an edge node got %+v", cond)
	}
}

// heartbeatsHeard is how many agents' heartbeats the controller's table took in.
func heartbeatsHeard(t *testing.T) float64 {
	t.Helper()
	v, ok := counter(t, "lifeline_liveness_messages_total", "kind", lifelinev1.KindHeartbeat.String())
	if !ok {
		t.Fatal("the controller serves no lifeline_liveness_messages_total of heartbeats")
	}
	return v
}

// heardOf is a table that has heard of no agent, counting how often it is asked.
type heardOf struct{ asked atomic.Int64 }

func (h *heardOf) AgentOf(string, time.Time) liveness.AgentState {
	h.asked.Add(1)
	return liveness.AgentState{}
}

// A new leader's table is empty until the agents reconnect to its broker: for Rehear after it starts, the writer
// leaves a node's condition as it is rather than flap it to AgentNeverHeard; after that it writes what it hears.
func TestANewLeaderDoesNotFlapTheFleetToNeverHeard(t *testing.T) {
	createNode(t, "edge-rehear", map[string]string{broker.EdgeNodeLabel: ""})
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the node lifecycle controller taints new Nodes
		node := &corev1.Node{}
		if err := kube.Get(context.Background(), client.ObjectKey{Name: "edge-rehear"}, node); err != nil {
			return err
		}
		node.Status.Conditions = []corev1.NodeCondition{nodecondition.Condition(
			liveness.AgentState{Heard: true, Online: true, APIKnown: true, APIReachable: true, LastHeartbeat: time.Now()}, time.Now())}
		return kube.Status().Update(context.Background(), node)
	})
	if err != nil {
		t.Fatal(err)
	}
	run := func(rehear time.Duration, passes int64) {
		t.Helper()
		agents := &heardOf{}
		stop := runWriter(&nodecondition.Writer{Client: kube, Agents: agents, Interval: 20 * time.Millisecond, Rehear: rehear, Now: time.Now, Log: logr.Discard()})
		testkit.Until(t, 10*time.Second, "the writer's passes", func() bool { return agents.asked.Load() >= passes })
		stop()
	}
	run(time.Hour, 10)
	if got := agentReason(t, "edge-rehear"); got != nodecondition.ReasonConnected {
		t.Errorf("a new writer changed the condition to %s before its agent could reconnect", got)
	}
	run(0, 3)
	if got := agentReason(t, "edge-rehear"); got != nodecondition.ReasonNeverHeard {
		t.Errorf("condition %s once the rehearing time is over, want %s", got, nodecondition.ReasonNeverHeard)
	}
}

// agentReason is the reason of node's LifelineAgent condition, or "" without one.
func agentReason(t *testing.T, node string) string {
	t.Helper()
	got := &corev1.Node{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: node}, got); err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == nodecondition.Type {
			return c.Reason
		}
	}
	return ""
}

// runWriter starts w and returns what stops it.
func runWriter(w *nodecondition.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Start(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// agentOf is a table that has heard of one node's agent, in the state it holds, and of no other.
type agentOf struct {
	node  string
	state atomic.Pointer[liveness.AgentState]
	asked atomic.Int64
}

func (a *agentOf) AgentOf(node string, _ time.Time) liveness.AgentState {
	if node != a.node {
		return liveness.AgentState{}
	}
	a.asked.Add(1)
	return *a.state.Load()
}

// queued is a backlog of n workload passes.
type queued struct{ n atomic.Int64 }

func (q *queued) Len() int { return int(q.n.Load()) }

// In a storm the workloads' statuses go first: while workload passes are queued, the writer holds the Nodes'
// conditions back, for at most YieldFor, and writes them once the passes are done or YieldFor is over.
func TestConditionsWaitForTheWorkloadPassesQueued(t *testing.T) {
	createNode(t, "edge-yield", map[string]string{broker.EdgeNodeLabel: ""})
	reason := func() string { return agentReason(t, "edge-yield") }
	agents, backlog := &agentOf{node: "edge-yield"}, &queued{}
	start := func(yieldFor time.Duration) (stop func()) {
		// Rehear keeps every other edge Node of the control plane as it is: this table heard of none of them.
		return runWriter(&nodecondition.Writer{Client: kube, Agents: agents, Interval: 20 * time.Millisecond, Rehear: time.Hour,
			Backlog: backlog, YieldFor: yieldFor, Now: time.Now, Log: logr.Discard()})
	}

	agents.state.Store(&liveness.AgentState{Heard: true, Online: true, APIKnown: true, APIReachable: true, LastHeartbeat: time.Now()})
	backlog.n.Store(5)
	stop := start(time.Hour)
	asked := agents.asked.Load()
	testkit.Until(t, 10*time.Second, "ten passes of the writer", func() bool { return agents.asked.Load() >= asked+10 })
	if got := reason(); got != "" {
		t.Errorf("the writer wrote %s with 5 workload passes queued", got)
	}
	backlog.n.Store(0)
	testkit.Until(t, 10*time.Second, "edge-yield's condition once the passes are done", func() bool {
		return reason() == nodecondition.ReasonConnected
	})
	stop()

	agents.state.Store(&liveness.AgentState{Heard: true, Online: true, APIKnown: true, LastHeartbeat: time.Now()})
	backlog.n.Store(5)
	const yieldFor = 500 * time.Millisecond
	began := time.Now()
	stop = start(yieldFor)
	defer stop()
	testkit.Until(t, 10*time.Second, "edge-yield's condition with passes still queued", func() bool {
		return reason() == nodecondition.ReasonAPIServerUnreachable
	})
	if took := time.Since(began); took < yieldFor {
		t.Errorf("the condition was written %v after the writer started, with passes queued, before YieldFor (%v)", took, yieldFor)
	}
}

// gathered is the value of the controller's gauge name, as its metrics endpoint would serve it.
func gathered(t *testing.T, name string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
