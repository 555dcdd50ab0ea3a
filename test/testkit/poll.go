package testkit

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval is how often a condition is asked, unless Every says otherwise.
const Interval = 20 * time.Millisecond

// Until waits up to within for ok to hold.
func Until(t testing.TB, within time.Duration, what string, ok func() bool) {
	t.Helper()
	UntilErr(t, within, what, func(context.Context) (bool, error) { return ok(), nil })
}

// UntilErr waits up to within for cond to hold; an error from cond is not fatal, but reported if the time runs out.
func UntilErr(t testing.TB, within time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	Every(t, Interval, within, what, cond)
}

// Every is UntilErr asking every interval: a condition that reads the API server asks less often.
func Every(t testing.TB, interval, within time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), interval, within, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err == nil {
		return
	}
	if last != nil {
		t.Fatalf("waiting %v for %s: not done (last: %v)", within, what, last)
	}
	t.Fatalf("waiting %v for %s: not done", within, what)
}

// Why makes a condition that says why it does not hold into one for UntilErr, which reports the last reason.
func Why(cond func() (bool, string)) func(context.Context) (bool, error) {
	return func(context.Context) (bool, error) {
		if ok, why := cond(); !ok {
			return false, errors.New(why)
		}
		return true, nil
	}
}

// Sample asks probe every interval for the whole window: for what holds all along a stretch of time rather than
// what comes to hold. An error from probe within the window is fatal.
func Sample(t testing.TB, interval, window time.Duration, probe func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		return false, probe(ctx)
	})
	if err != nil && ctx.Err() == nil {
		t.Fatalf("sampling for %v: %v", window, err)
	}
}
