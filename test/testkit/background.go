package testkit

import (
	"context"
	"testing"
)

// Background runs run in a goroutine under a context of ctx that ends when the test ends, and waits at the
// test's cleanup until run has returned: a daemon that writes to a t.TempDir registered before Background has
// stopped writing when the directory is removed.
func Background(t testing.TB, ctx context.Context, run func(ctx context.Context)) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
