package main

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lifeline-edge/lifeline/edge/cri"
)

// FollowContainerEvents keeps the runtime's event stream open, so a worker's change is published within
// milliseconds; the agent's poll covers runtimes without events and the gaps between streams. A stream that ends
// at once (a runtime that serves the call but sends nothing, as edgemark's fake one does) is opened again after a
// wait that doubles up to half a minute, not every second for ever.
func FollowContainerEvents(ctx context.Context, runtime *cri.Client, changed chan<- struct{}, log logr.Logger) {
	wait := eventsRetry{min: time.Second, max: 30 * time.Second}
	for ctx.Err() == nil {
		opened := time.Now()
		err := runtime.WatchEvents(ctx, changed)
		if status.Code(err) == codes.Unimplemented {
			log.Info("the container runtime offers no events; polling only")
			return
		}
		next := wait.next(time.Since(opened))
		log.V(2).Info("container events stopped; reopening", "error", err, "after", next)
		select {
		case <-ctx.Done():
		case <-time.After(next):
		}
	}
}

// eventsRetry is the wait before the event stream is opened again: min after a stream that lasted, doubling
// after each one that ended within a second, up to max.
type eventsRetry struct {
	min, max, cur time.Duration
}

func (r *eventsRetry) next(lasted time.Duration) time.Duration {
	switch {
	case lasted > time.Second || r.cur == 0:
		r.cur = r.min
	default:
		r.cur = min(2*r.cur, r.max)
	}
	return r.cur
}
