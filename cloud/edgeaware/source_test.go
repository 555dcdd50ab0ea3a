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
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clock})
	defer q.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := src.Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	waitLen := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); q.Len() != want && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if got := q.Len(); got != want {
			t.Fatalf("%d requests queued, want %d", got, want)
		}
	}

	for seq := uint64(1); seq <= 5; seq++ {
		b.report("edge1", &lifelinev1.WorkerReport{Namespace: "default", Worker: "svc-edge", Seq: seq,
			Body: []byte(`{"name":"svc-edge","namespace":"default","ownerName":"svc","ownerKind":"jointinferenceservice","kind":"inference"}`)}, now)
	}
	time.Sleep(100 * time.Millisecond) // delivery is asynchronous: give it the time to (wrongly) queue at once
	waitLen(0)
	clock.Step(10 * time.Second)
	waitLen(1)
	r, _ := q.Get()
	q.Done(r)
	if r != svc {
		t.Fatalf("woke %v, want %v", r, svc)
	}

	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: pod.Name, Uid: "e", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	waitLen(1) // no step of the clock: at once
}

// On controller-runtime's priority queue, a pass for an agent's word on a worker of a cut-off node goes ahead
// of those queued for anything else; the word of an agent whose node reaches the API server waits its turn.
func TestCutOffLivenessJumpsTheQueue(t *testing.T) {
	for _, cutOff := range []bool{true, false} {
		t.Run(fmt.Sprintf("cut off %v", cutOff), func(t *testing.T) {
			b := newBench(t)
			pod := b.addPod("edge1", "default", "svc-edge-x", "e")
			b.pods[podRef{"default", "svc-edge-x"}] = liveness.PodInfo{Node: "edge1", UID: "e", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}
			now := time.Now() // SpeaksFor asks whether the agent is heard now
			b.birth("edge1", 1, "s", now)
			b.heartbeat("edge1", 1, 1, !cutOff, now)
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
			for deadline := time.Now().Add(5 * time.Second); q.Len() < 51 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if first, _ := q.Get(); (first == svc) != cutOff {
				t.Errorf("first pass %v; the agent's word first: %v, want %v", first, first == svc, cutOff)
			}
		})
	}
}
