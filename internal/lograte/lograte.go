// Package lograte says when a failure that lasts is logged again, for both of Lifeline's daemons: at once, so it
// is seen, and then at growing gaps, so it does not flood the log.
package lograte

import "time"

// The gaps: the first repeat after FirstRepeat, then each gap twice the one before, up to MaxRepeat.
const (
	FirstRepeat = time.Minute
	MaxRepeat   = 10 * time.Minute
)

// Schedule is one lasting failure's. The zero value logs at the first Due.
type Schedule struct {
	next time.Time
	gap  time.Duration
}

// Due tells whether to log now, and if so moves the next time on.
func (s *Schedule) Due(now time.Time) bool {
	if !s.next.IsZero() && now.Before(s.next) {
		return false
	}
	if s.gap == 0 {
		s.gap = FirstRepeat
	} else {
		s.gap = min(2*s.gap, MaxRepeat)
	}
	s.next = now.Add(s.gap)
	return true
}
