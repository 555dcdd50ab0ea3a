package workload

import (
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Backlog counts the passes the workload controllers have queued and ready to run, of every kind: what writers
// of lesser urgency (the Nodes' LifelineAgent conditions) wait for, so that in a storm the API server takes the
// workloads' statuses first.
type Backlog struct {
	mu     sync.Mutex
	queues []workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// Len is how many passes are ready to run in every controller's queue (those waiting out a delay are not).
func (b *Backlog) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, q := range b.queues {
		n += q.Len()
	}
	return n
}

// newQueue makes a controller's work queue as controller-runtime does by default (its priority queue), and
// counts it in the backlog.
func (b *Backlog) newQueue(log logr.Logger) func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return func(name string, limiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		q := priorityqueue.New(name, func(o *priorityqueue.Opts[reconcile.Request]) {
			o.Log, o.RateLimiter = log.WithValues("controller", name), limiter
		})
		b.mu.Lock()
		defer b.mu.Unlock()
		b.queues = append(b.queues, q)
		return q
	}
}
