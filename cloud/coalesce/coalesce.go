// Package coalesce delays the passes that changes of a workload's children call for, so that a burst of them — a
// job's pods starting one after the other, each with several status changes — costs one pass and one status
// write rather than one per change, as the Job controller batches the events of its pods.
package coalesce

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Period is how long a child's creation or change waits before its workload's pass: the Job controller's batch
// period.
const Period = time.Second

// Changes wraps h: the requests it makes for created and changed objects are queued Period later, where the work
// queue folds them into one; a deletion's are queued at once, so a lost child is rebuilt without delay.
func Changes(h handler.EventHandler) handler.EventHandler {
	return changes{h}
}

type changes struct{ handler.EventHandler }

func (c changes) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.EventHandler.Create(ctx, e, later{q})
}

func (c changes) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.EventHandler.Update(ctx, e, later{q})
}

// later queues what is added Period from now.
type later struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
}

func (l later) Add(r reconcile.Request) { l.AddAfter(r, Period) }
