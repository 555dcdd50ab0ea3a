package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// The tap keeps the latest error a component logs, at any verbosity, and passes on only what the logger it
// wraps would have written.
func TestErrorTap(t *testing.T) {
	var written []string
	base := funcr.New(func(prefix, args string) { written = append(written, prefix+" "+args) }, funcr.Options{Verbosity: 0})
	var tap ErrorTap
	log := tap.Logger(base).WithName("publisher").WithValues("k", "v")
	if tap.Err() != nil {
		t.Fatalf("a new tap holds %v", tap.Err())
	}
	log.V(2).Info("broker unreachable", "broker", "tcp://b:1883", "error", "dial tcp: connection refused")
	if got := fmt.Sprint(tap.Err()); got != "dial tcp: connection refused" {
		t.Errorf("after a -v=2 line: %q", got)
	}
	if len(written) != 0 {
		t.Errorf("a -v=2 line was written at verbosity 0: %q", written)
	}
	log.Info("connected", "birthSeq", 3)
	if got := fmt.Sprint(tap.Err()); got != "dial tcp: connection refused" {
		t.Errorf("a line without an error changed it: %q", got)
	}
	log.Error(errors.New("not Authorized"), "login")
	if got := fmt.Sprint(tap.Err()); got != "not Authorized" {
		t.Errorf("after Error: %q", got)
	}
	if len(written) != 2 || !strings.Contains(written[1], `"msg"="login"`) || !strings.HasPrefix(written[1], "publisher ") {
		t.Errorf("written: %q", written)
	}
	var discard ErrorTap
	discard.Logger(logr.Discard()).V(4).Info("x", "err", errors.New("gone"))
	if got := fmt.Sprint(discard.Err()); got != "gone" {
		t.Errorf("behind a discarding logger: %q", got)
	}
}
