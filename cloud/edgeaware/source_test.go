package edgeaware

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// podsByName reads worker pods for Source's mapping, as the manager's cache would.
type podsByName map[string]*corev1.Pod

func (p podsByName) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	pod, ok := p[key.Name]
	if !ok {
		return fmt.Errorf("no pod %s", key)
	}
	*obj.(*corev1.Pod) = *pod
	return nil
}

func (p podsByName) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// A burst of reports wakes its workload once, ReportPeriod after the first; a change of a worker's liveness
// wakes it at once.
func TestSourceFoldsReportsAndNeverDelaysLiveness(t *testing.T) {
	b := newBench(t)
	pod := b.addPod("edge1", "default", "svc-edge-x", "e")
	b.pods[podRef{"default", "svc-edge-x"}] = liveness.PodInfo{Node: "edge1", UID: "e", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}
	now := time.Unix(1000, 0)
	b.birth("edge1", 1, "s", now)

	svc := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "svc"}}
	edge := &Edge{Tracker: b.tr, ReportPeriod: 10 * time.Second}
	src := edge.Source(podsByName{pod.Name: pod}, func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{svc}
	}, "JointInferenceService")
	clock := clocktesting.NewFakeClock(time.Now())
	q := &addsSeen{TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clock}), added: make(chan struct{}, 16)}
	defer q.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := src.Start(ctx, q); err != nil {
		t.Fatal(err)
	}

	// Each report is handed over before the next is made, so the source adds once for each and, when the last
	// add is seen, has no more to make.
	for seq := uint64(1); seq <= 5; seq++ {
		b.report("edge1", &lifelinev1.WorkerReport{Namespace: "default", Worker: "svc-edge", Seq: seq,
			Body: []byte(`{"name":"svc-edge","namespace":"default","ownerName":"svc","ownerKind":"jointinferenceservice","kind":"inference"}`)}, now)
		q.waitAdd(t)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d requests queued at once for reports, want none before the report period", n)
	}
	clock.Step(10 * time.Second)
	testkit.Until(t, 5*time.Second, "the folded reports' request", func() bool { return q.Len() != 0 })
	if n := q.Len(); n != 1 {
		t.Fatalf("%d requests queued once the report period ended, want the burst folded into 1", n)
	}
	r, _ := q.Get()
	q.Done(r)
	if r != svc {
		t.Fatalf("woke %v, want %v", r, svc)
	}

	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: pod.Name, Uid: "e", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	q.waitAdd(t)
	if n := q.Len(); n != 1 { // no step of the clock: at once
		t.Fatalf("%d requests queued right after a change of liveness, want 1", n)
	}
}

// addsSeen is a work queue that tells when the source has added to it, with or without delay.
type addsSeen struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	added chan struct{}
}

func (q *addsSeen) Add(r reconcile.Request) {
	q.TypedRateLimitingInterface.Add(r)
	q.added <- struct{}{}
}

func (q *addsSeen) AddAfter(r reconcile.Request, delay time.Duration) {
	q.TypedRateLimitingInterface.AddAfter(r, delay)
	q.added <- struct{}{}
}

func (q *addsSeen) waitAdd(t *testing.T) {
	t.Helper()
	select {
	case <-q.added:
	case <-time.After(5 * time.Second):
		t.Fatal("the source added nothing within 5 s")
	}
}

// On controller-runtime's priority queue, a pass for an agent's word on a worker of a cut-off node, or of a node
// whose link has just come back, goes ahead of those queued for anything else; the word of an agent whose node
// reaches the API server waits its turn.
func TestCutOffLivenessJumpsTheQueue(t *testing.T) {
	for _, tt := range []struct {
		name  string
		links []bool // what the agent's heartbeats say of the node's link, in turn
		first bool   // whether the agent's word goes first
	}{
		{"cut off", []bool{false}, true},
		{"reaches the API server", []bool{true}, false},
		{"link back after a cut", []bool{false, true}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newBench(t)
			pod := b.addPod("edge1", "default", "svc-edge-x", "e")
			b.pods[podRef{"default", "svc-edge-x"}] = liveness.PodInfo{Node: "edge1", UID: "e", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}
			now := time.Now() // SpeaksFor asks whether the agent is heard now
			b.birth("edge1", 1, "s", now)
			for i, reachable := range tt.links {
				b.heartbeat("edge1", 1, uint64(i+1), reachable, now)
			}
			svc := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "svc"}}
			src := (&Edge{Tracker: b.tr}).Source(podsByName{pod.Name: pod}, func(context.Context, client.Object) []reconcile.Request {
				return []reconcile.Request{svc}
			}, "JointInferenceService")
			q := priorityqueue.New[reconcile.Request]("test")
			defer q.ShutDown()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := src.Start(ctx, q); err != nil {
				t.Fatal(err)
			}
			for i := range 50 { // a creation burst's passes, queued first
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("other-%d", i)}})
			}
			b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: pod.Name, Uid: "e", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
			testkit.Until(t, 5*time.Second, "the agent's word queued", func() bool { return q.Len() == 51 })
			if first, _ := q.Get(); (first == svc) != tt.first {
				t.Errorf("first pass %v; the agent's word first: %v, want %v", first, first == svc, tt.first)
			}
		})
	}
}
