package lograte

import (
	"slices"
	"testing"
	"time"
)

func TestGapsDoubleUpToTenMinutes(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var s Schedule
	var at []time.Duration
	for d := time.Duration(0); d <= 40*time.Minute; d += time.Second {
		if s.Due(t0.Add(d)) {
			at = append(at, d)
		}
	}
	want := []time.Duration{0, time.Minute, 3 * time.Minute, 7 * time.Minute, 15 * time.Minute, 25 * time.Minute, 35 * time.Minute}
	if !slices.Equal(at, want) {
		t.Errorf("logged at %v, want %v", at, want)
	}
}
