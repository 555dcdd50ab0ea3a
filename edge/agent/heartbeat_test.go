package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

type recordingSender struct {
	mu    sync.Mutex
	beats []*lifelinev1.Heartbeat
	topic string
}

func (s *recordingSender) PublishNow(topic string, payload []byte) bool {
	hb := &lifelinev1.Heartbeat{}
	if err := proto.Unmarshal(payload, hb); err != nil {
		panic(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.topic, s.beats = topic, append(s.beats, hb)
	return true
}

func (s *recordingSender) BirthSeq() uint64 { return 4 }

func (s *recordingSender) last() (string, *lifelinev1.Heartbeat, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.beats) == 0 {
		return "", nil, 0
	}
	return s.topic, s.beats[len(s.beats)-1], len(s.beats)
}

// Each heartbeat says, as it is sent, whether the node reaches the API server, how many messages wait in the
// journal and how many workers get no stand-in, counting from 1 within the session's birth.
func TestHeartbeatsSayTheNodesReachAndJournalAsTheyAreSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &recordingSender{}
		var mu sync.Mutex
		reachable, journaled := true, int64(3)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			Heartbeats(ctx, "c", "edge1", 10*time.Millisecond, s, HeartbeatFacts{
				APIReachable: func() bool { mu.Lock(); defer mu.Unlock(); return reachable },
				Journaled:    func() int64 { mu.Lock(); defer mu.Unlock(); return journaled },
				Oversized:    func() int { return 2 }})
		}()
		defer func() { cancel(); <-done }()
		time.Sleep(10 * time.Millisecond) // the bubble's clock: one interval
		synctest.Wait()
		if topic, hb, n := s.last(); n != 1 || topic != "lifeline/v1/c/nodes/edge1/heartbeat" || hb.BirthSeq != 4 || hb.Seq != 1 ||
			!hb.ApiReachable || hb.JournalReports != 3 || hb.OversizedWorkers != 2 {
			t.Fatalf("after one interval, %d heartbeats, the last on %s: %v", n, topic, hb)
		}
		mu.Lock()
		reachable, journaled = false, 1<<40 // more than the field holds: said as its largest value
		mu.Unlock()
		time.Sleep(10 * time.Millisecond) // the bubble's clock: the next interval
		synctest.Wait()
		if _, hb, n := s.last(); n != 2 || hb.Seq != 2 || hb.ApiReachable || hb.JournalReports != 1<<32-1 {
			t.Fatalf("after the next interval, %d heartbeats, the last %v", n, hb)
		}
	})
}

// A change of the node's reach goes out at once, not at the next interval: a cut is told when it is seen.
func TestHeartbeatGoesOutWhenTheReachChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &recordingSender{}
		var reachable atomic.Bool
		reachable.Store(true)
		changed := make(chan struct{}, 1)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go Heartbeats(ctx, "c", "edge1", time.Hour, s, HeartbeatFacts{APIReachable: reachable.Load, Changed: changed})
		synctest.Wait()
		if _, _, n := s.last(); n != 0 {
			t.Fatalf("%d heartbeats before the first interval or change", n)
		}
		reachable.Store(false)
		changed <- struct{}{}
		synctest.Wait()
		if _, hb, n := s.last(); n != 1 || hb.ApiReachable || hb.Seq != 1 {
			t.Fatalf("after the change: %d heartbeats, the last %v", n, hb)
		}
		time.Sleep(time.Hour - time.Nanosecond) // the interval starts again at the change
		synctest.Wait()
		if _, _, n := s.last(); n != 1 {
			t.Fatalf("%d heartbeats before the interval ended", n)
		}
		time.Sleep(time.Nanosecond) // the bubble's clock: to the interval's end
		synctest.Wait()
		if _, hb, n := s.last(); n != 2 || hb.Seq != 2 {
			t.Fatalf("after the interval: %d heartbeats, the last %v", n, hb)
		}
	})
}
