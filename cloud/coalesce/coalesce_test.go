package coalesce

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestChangesAreFoldedAndDeletionsAreNot(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clock})
	defer q.ShutDown()
	toOwner := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: "owner"}}}
	})
	h := Changes(toOwner)
	pod := func(rv string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", ResourceVersion: rv}}
	}
	ctx := context.Background()
	h.Create(ctx, event.CreateEvent{Object: pod("1")}, q)
	for rv := 2; rv < 6; rv++ {
		h.Update(ctx, event.UpdateEvent{ObjectOld: pod("1"), ObjectNew: pod("2")}, q)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d requests queued at once for a creation and changes, want none before the period", n)
	}
	clock.Step(Period - time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the queue's own goroutine moves what is due
	if n := q.Len(); n != 0 {
		t.Fatalf("%d requests queued before the period ended", n)
	}
	clock.Step(time.Millisecond)
	for deadline := time.Now().Add(5 * time.Second); q.Len() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := q.Len(); n != 1 {
		t.Fatalf("%d requests once the period ended, want the burst folded into 1", n)
	}
	r, _ := q.Get()
	q.Done(r)
	h.Delete(ctx, event.DeleteEvent{Object: pod("6")}, q)
	if n := q.Len(); n != 1 {
		t.Errorf("%d requests right after a deletion, want 1 at once", n)
	}
}
