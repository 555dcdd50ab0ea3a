package desiredsets

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

type agentsByNode map[string]liveness.AgentState

func (a agentsByNode) AgentOf(node string, _ time.Time) liveness.AgentState { return a[node] }

type podsByNode map[string][]corev1.Pod

func (p podsByNode) NodeWorkers(_ context.Context, node string) ([]corev1.Pod, error) {
	return p[node], nil
}

// sentSets keeps what the sender published, decoded, by node.
type sentSets map[string][]*lifelinev1.DesiredWorkers

func (s sentSets) PublishDesired(node string, payload []byte) error {
	var set lifelinev1.DesiredWorkers
	if err := proto.Unmarshal(payload, &set); err != nil {
		return err
	}
	s[node] = append(s[node], &set)
	return nil
}

// [P-DES-1] [P-DES-2]: a set goes to an agent in session, again only when it changes or a new session begins, and
// each one's revision is greater than the last.
func TestSenderSendsASetPerSessionAndChange(t *testing.T) {
	clock := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	agents := agentsByNode{"edge-1": {Heard: true, BirthSeq: 7}, "edge-2": {}}
	pods := podsByNode{"edge-1": {workerPod("a", "edge-1", corev1.PodRunning)}, "edge-2": {workerPod("b", "edge-2", corev1.PodRunning)}}
	sent := sentSets{}
	s := &Sender{Out: sent, Agents: agents, Pods: pods, Log: logr.Discard(), Now: func() time.Time { return clock }}
	s.init()
	sync := func(node string) {
		t.Helper()
		if err := s.sync(context.Background(), node); err != nil {
			t.Fatal(err)
		}
	}

	sync("edge-1")
	sync("edge-1")
	sync("edge-2")
	if len(sent["edge-1"]) != 1 || len(sent["edge-2"]) != 0 {
		t.Fatalf("sent %d sets to edge-1 and %d to edge-2, want one to the agent in session and none to the one never heard",
			len(sent["edge-1"]), len(sent["edge-2"]))
	}
	first := sent["edge-1"][0]
	if first.BirthSeq != 7 || first.Node != "edge-1" || len(first.Workers) != 1 {
		t.Errorf("first set %v: want session 7's, edge-1's one worker", first)
	}

	pods["edge-1"] = append(pods["edge-1"], workerPod("c", "edge-1", corev1.PodPending))
	sync("edge-1")
	agents["edge-1"] = liveness.AgentState{Heard: true, BirthSeq: 8}
	sync("edge-1")
	if len(sent["edge-1"]) != 3 {
		t.Fatalf("sent %d sets, want 3: the first, the changed one, the new session's", len(sent["edge-1"]))
	}
	changed, reborn := sent["edge-1"][1], sent["edge-1"][2]
	if len(changed.Workers) != 2 || changed.BirthSeq != 7 || changed.Revision <= first.Revision {
		t.Errorf("changed set: %d workers, session %d, revision %d after %d", len(changed.Workers), changed.BirthSeq, changed.Revision, first.Revision)
	}
	if reborn.BirthSeq != 8 || reborn.Revision <= changed.Revision {
		t.Errorf("new session's set: session %d, revision %d after %d", reborn.BirthSeq, reborn.Revision, changed.Revision)
	}

	agents["edge-1"] = liveness.AgentState{Heard: true, BirthSeq: 8, Stopped: true}
	pods["edge-1"] = pods["edge-1"][:1]
	sync("edge-1")
	if len(sent["edge-1"]) != 3 {
		t.Errorf("a set went to an agent that said it stopped")
	}
}

// A pod's status changes alone send no set; a bind, a label or the start do.
func TestOnlyChangesOfTheSetEnqueueANode(t *testing.T) {
	base := workerPod("a", "edge-1", corev1.PodPending)
	status := base.DeepCopy()
	status.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady}}
	started := base.DeepCopy()
	started.Status.Phase = corev1.PodRunning
	relabelled := base.DeepCopy()
	relabelled.Labels["new"] = "x"
	cases := []struct {
		name  string
		after *corev1.Pod
		want  bool
	}{
		{"a condition", status, false},
		{"started", started, true},
		{"relabelled", relabelled, true},
	}
	for _, tc := range cases {
		if got := changesSet(&base, tc.after); got != tc.want {
			t.Errorf("%s: changesSet %t, want %t", tc.name, got, tc.want)
		}
	}
}

// A node's pod changes within the batch period render its set once, when the period of the first ends; a
// session's birth at once.
func TestAPodChangeWaitsForTheBatchOfItsNode(t *testing.T) {
	start := time.Unix(1700000000, 0)
	clock := clocktesting.NewFakeClock(start)
	s := &Sender{PodChangeBatch: time.Second, Clock: clock}
	s.init()
	defer s.queue.ShutDown()
	handler := s.PodEvents()
	a, b := workerPod("a", "edge-1", corev1.PodPending), workerPod("b", "edge-1", corev1.PodPending)
	handler.OnAdd(&a, false)
	clock.Step(500 * time.Millisecond)
	handler.OnAdd(&b, false)
	startedA := a.DeepCopy()
	startedA.Status.Phase = corev1.PodRunning
	handler.OnUpdate(&a, startedA)
	s.Enqueue("edge-2") // a birth
	if node, _ := s.queue.Get(); node != "edge-2" || s.queue.Len() != 0 {
		t.Fatalf("got %q first and %d more, want the node whose agent was born alone", node, s.queue.Len())
	}
	s.queue.Done("edge-2")
	// The queue's own goroutine sets its timers from the clock as it finds it, so the clock moves in small steps
	// until the node is ready.
	for s.queue.Len() == 0 && clock.Since(start) < 10*time.Second {
		clock.Step(50 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	if waited := clock.Since(start); waited < time.Second {
		t.Errorf("the node was ready %v after its first change, want the batch period (1 s)", waited)
	}
	if node, _ := s.queue.Get(); node != "edge-1" || s.queue.Len() != 0 {
		t.Errorf("got %q and %d more, want edge-1 once for its three changes", node, s.queue.Len())
	}
}

// A mirror pod or a stand-in (which carry their worker's labels) enqueues nothing; a worker's pod its node.
func TestPodEventsEnqueueTheNodesOfWorkersOnly(t *testing.T) {
	s := &Sender{}
	s.init()
	handler := s.PodEvents()
	mirror := workerPod("w-edge-1", "edge-1", corev1.PodRunning)
	mirror.Annotations[corev1.MirrorPodAnnotationKey] = "x"
	standIn := workerPod("w-edge-2", "edge-2", corev1.PodRunning)
	standIn.Annotations[lifelinev1.StaticPodOfAnnotation] = "default/w"
	handler.OnAdd(&mirror, false)
	handler.OnAdd(&standIn, false)
	if n := s.queue.Len(); n != 0 {
		t.Errorf("%d nodes enqueued for a mirror pod and a stand-in", n)
	}
	worker := workerPod("w", "edge-3", corev1.PodRunning)
	handler.OnAdd(&worker, false)
	if node, _ := s.queue.Get(); s.queue.Len() != 0 || node != "edge-3" {
		t.Errorf("enqueued %q, want the worker's node alone", node)
	}
}
