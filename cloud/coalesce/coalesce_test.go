package coalesce

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestChangesAreFoldedAndDeletionsAreNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
		synctest.Wait() // the queue's own goroutine has taken every delayed add
		if n := q.Len(); n != 0 {
			t.Fatalf("%d requests queued at once for a creation and changes, want none before the period", n)
		}
		clock.Step(Period - time.Millisecond)
		synctest.Wait() // the queue's own goroutine has moved what is due
		if n := q.Len(); n != 0 {
			t.Fatalf("%d requests queued before the period ended", n)
		}
		clock.Step(time.Millisecond)
		synctest.Wait()
		if n := q.Len(); n != 1 {
			t.Fatalf("%d requests once the period ended, want the burst folded into 1", n)
		}
		r, _ := q.Get()
		q.Done(r)
		h.Delete(ctx, event.DeleteEvent{Object: pod("6")}, q)
		if n := q.Len(); n != 1 {
			t.Errorf("%d requests right after a deletion, want 1 at once", n)
		}
	})
}

// On controller-runtime's priority queue, a pass that can change children goes ahead of every pass that can only
// refresh a status, whichever was queued first; a change that acts raises a refresh already queued for its
// workload.
func TestChangesThatActGoAheadOfRefreshes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := priorityqueue.New[reconcile.Request]("coalesce-test")
		defer q.ShutDown()
		h := Changes(handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetLabels()["owner"]}}}
		}))
		pod := func(owner, rv string, phase corev1.PodPhase) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: owner + "-pod", ResourceVersion: rv,
				Labels: map[string]string{"owner": owner}}, Status: corev1.PodStatus{Phase: phase}}
		}
		deployment := func(owner string, generation int64) *appsv1.Deployment {
			return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: owner, Generation: generation,
				Labels: map[string]string{"owner": owner}}}
		}
		ctx := context.Background()
		h.Create(ctx, event.CreateEvent{Object: pod("created", "1", corev1.PodPending)}, q)
		h.Update(ctx, event.UpdateEvent{ObjectOld: pod("started", "1", corev1.PodPending), ObjectNew: pod("started", "2", corev1.PodRunning)}, q)
		h.Update(ctx, event.UpdateEvent{ObjectOld: deployment("rolled", 1), ObjectNew: deployment("rolled", 1)}, q)
		h.Update(ctx, event.UpdateEvent{ObjectOld: pod("failed", "1", corev1.PodRunning), ObjectNew: pod("failed", "2", corev1.PodFailed)}, q)
		h.Update(ctx, event.UpdateEvent{ObjectOld: deployment("edited", 1), ObjectNew: deployment("edited", 2)}, q)
		h.Update(ctx, event.UpdateEvent{ObjectOld: pod("raised", "1", corev1.PodPending), ObjectNew: pod("raised", "2", corev1.PodRunning)}, q)
		h.Delete(ctx, event.DeleteEvent{Object: pod("raised", "3", corev1.PodRunning)}, q)

		first, _ := q.Get() // the deletion, at once
		q.Done(first)
		if first.Name != "raised" {
			t.Fatalf("first pass for %q, want the deleted pod's owner at once", first.Name)
		}
		if n := q.Len(); n != 0 {
			t.Fatalf("%d more passes ready before the period ended, want none", n)
		}
		// Ranks order the passes that are due together: in the bubble, all five fall due at the same instant.
		time.Sleep(Period)
		synctest.Wait()
		if n := q.Len(); n != 5 {
			t.Fatalf("%d passes ready once the period ended, want 5", n)
		}
		var order []string
		for range 5 {
			r, _ := q.Get()
			q.Done(r)
			order = append(order, r.Name)
		}
		acted, refreshed := order[:2], order[2:]
		slices.Sort(acted)
		slices.Sort(refreshed)
		if !slices.Equal(acted, []string{"edited", "failed"}) || !slices.Equal(refreshed, []string{"created", "rolled", "started"}) {
			t.Errorf("passes in the order %v, want the edited Deployment's and the failed pod's first", order)
		}
	})
}

func TestAddRefreshWaitsItsDelayOnEitherQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "job"}}
		for name, q := range map[string]workqueue.TypedRateLimitingInterface[reconcile.Request]{
			"priority": priorityqueue.New[reconcile.Request]("coalesce-refresh-test"),
			"plain":    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]()),
		} {
			AddRefresh(q, r, 0)
			if n := q.Len(); n != 1 {
				t.Errorf("%s queue: %d passes right after a refresh without delay, want 1", name, n)
			}
			got, _ := q.Get()
			q.Done(got)
			added := time.Now()
			AddRefresh(q, r, time.Hour)
			time.Sleep(time.Hour - time.Millisecond) // the bubble's clock: the queue's goroutines run what falls due
			synctest.Wait()
			if n := q.Len(); n != 0 {
				t.Errorf("%s queue: %d passes ready within an hour's delay, want none", name, n)
			}
			got, _ = q.Get() // blocks while the bubble's clock runs on to the queue's next timer
			q.Done(got)
			if waited := time.Since(added); got != r || waited < time.Hour {
				t.Errorf("%s queue: pass %v ready after %v, want %v after the hour's delay", name, got, waited, r)
			}
			q.ShutDown()
		}
	})
}
