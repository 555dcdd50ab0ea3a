package desired

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/go-logr/logr"
)

// watchRecorder is a pod source that lists nothing and keeps each watch open until its context ends, as
// PodClient does, recording each watch's context.
type watchRecorder struct {
	mu      sync.Mutex
	watches []context.Context
	watched chan struct{}
}

func (r *watchRecorder) List(context.Context, Selector, func(*Pod)) (string, error) { return "", nil }

func (r *watchRecorder) Watch(ctx context.Context, _ Selector, _ string) (<-chan Event, error) {
	r.mu.Lock()
	r.watches = append(r.watches, ctx)
	r.mu.Unlock()
	r.watched <- struct{}{}
	events := make(chan Event)
	go func() {
		<-ctx.Done()
		close(events)
	}()
	return events, nil
}

func (r *watchRecorder) watch(i int) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watches[i]
}

// A watch the watcher leaves because a hold ended is closed, not left holding its connection (and the reader
// blocked on it) until the agent stops; the watch that replaces it stays open.
func TestAWatchLeftWhenAHoldEndsIsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &watchRecorder{watched: make(chan struct{}, 1)}
		w, err := New(src, "edge1", t.TempDir(), logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		var held atomic.Bool
		held.Store(true)
		w.Hold = held.Load
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go w.Run(ctx, 0)
		<-src.watched
		synctest.Wait()
		held.Store(false)
		<-src.watched // the bubble's clock runs on to the watcher's next look at the hold
		synctest.Wait()
		if err := src.watch(0).Err(); err == nil {
			t.Error("the watch left when the hold ended is still open")
		}
		if err := src.watch(1).Err(); err != nil {
			t.Errorf("the watch that replaced it is closed: %v", err)
		}
	})
}
