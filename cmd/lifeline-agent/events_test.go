package main

import (
	"slices"
	"testing"
	"time"
)

// The event stream of a runtime that ends it at once is opened again after a wait that doubles up to half a
// minute; one that lasted starts the wait again from a second.
func TestEventStreamEndingAtOnceIsReopenedLessAndLessOften(t *testing.T) {
	r := eventsRetry{min: time.Second, max: 30 * time.Second}
	var got []time.Duration
	for range 7 {
		got = append(got, r.next(time.Millisecond))
	}
	got = append(got, r.next(time.Minute))
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
}
