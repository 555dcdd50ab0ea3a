package harness

import (
	"sync"
	"time"
)

// SteppingClock is the controller's clock in the integration tests: the real time, plus what the test stepped
// it forward by, so a backoff, a deadline or a TTL falls due when the test says, without sleeping through it,
// while everything else (informers, requeues, the fake kubelet) runs on real time. It only goes forward: the
// times the controller wrote into status stay in its past.
type SteppingClock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now is the real time plus the steps taken.
func (c *SteppingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Since is Now() - t.
func (c *SteppingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Step moves the clock forward by d.
func (c *SteppingClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}
