// Package coalesce delays the passes that changes of a workload's children call for, so that a burst of them — a
// job's pods starting one after the other, each with several status changes — costs one pass and one status
// write rather than one per change, as the Job controller batches the events of its pods. It also ranks them:
// a change that only moves a status on queues below the passes that make or rebuild children.
package coalesce

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Period is how long a child's creation or change waits before its workload's pass: the Job controller's batch
// period.
const Period = time.Second

// RefreshPriority is the work-queue priority of a pass that can only refresh a workload's status: a child
// appearing or progressing (a rollout, a pod starting), a worker's report. It is below the default (0) of the
// passes that can change children — a workload created or edited, a child lost, a pod ended — so that when many
// workloads are created at once, each gets its children before any status is refreshed; and above
// controller-runtime's LowPriority (-100) of the workloads a restarted controller lists.
const RefreshPriority = -10

// Changes wraps h: the requests it makes for created and changed objects are queued Period later, where the work
// queue folds them into one, at RefreshPriority unless the change can call for an action (acts); a deletion's
// are queued at once, so a lost child is rebuilt without delay.
func Changes(h handler.EventHandler) handler.EventHandler {
	return changes{h}
}

type changes struct{ handler.EventHandler }

func (c changes) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.EventHandler.Create(ctx, e, later{q, RefreshPriority})
}

func (c changes) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	priority := RefreshPriority
	if acts(e.ObjectOld, e.ObjectNew) {
		priority = 0
	}
	c.EventHandler.Update(ctx, e, later{q, priority})
}

// acts tells whether a child's change can call for its workload to act rather than only to refresh its status:
// its spec changed (someone edited it), its deletion began, or, for a pod, it ended (a failed worker is rebuilt,
// a finished one may finish its job).
func acts(old, changed client.Object) bool {
	if old == nil || changed == nil {
		return true
	}
	if old.GetGeneration() != changed.GetGeneration() || (old.GetDeletionTimestamp() == nil) != (changed.GetDeletionTimestamp() == nil) {
		return true
	}
	oldPod, isPod := old.(*corev1.Pod)
	newPod, _ := changed.(*corev1.Pod)
	return isPod && newPod != nil && ended(newPod) && !ended(oldPod)
}

func ended(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// AddRefresh queues r after delay at RefreshPriority on controller-runtime's priority queue (its default), after
// delay on a plain one.
func AddRefresh(q workqueue.TypedRateLimitingInterface[reconcile.Request], r reconcile.Request, delay time.Duration) {
	later{q, RefreshPriority}.addAfter(r, delay)
}

// later queues what is added Period from now, at its priority.
type later struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	priority int
}

func (l later) Add(r reconcile.Request) { l.addAfter(r, Period) }

func (l later) addAfter(r reconcile.Request, delay time.Duration) {
	if pq, ok := l.TypedRateLimitingInterface.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{After: delay, Priority: ptr.To(l.priority)}, r)
		return
	}
	if delay > 0 {
		l.AddAfter(r, delay)
		return
	}
	l.TypedRateLimitingInterface.Add(r)
}
