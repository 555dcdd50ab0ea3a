package agent

import (
	"errors"
	"sync"

	"github.com/go-logr/logr"
)

// ErrorTap remembers the latest error a component logged, at any verbosity, so the agent's probes and its
// first-failure log lines can say why a dependency fails (the broker refused the login, the MetaServer's address
// refuses connections) though the component logs its retries only at -v=2. Safe for concurrent use.
type ErrorTap struct {
	mu  sync.Mutex
	err error
}

// Logger is l, also noting in the tap each error it is given: through Error, or as the value of an "error" or
// "err" key. What l logs is unchanged.
func (t *ErrorTap) Logger(l logr.Logger) logr.Logger {
	return logr.New(tapSink{inner: l.GetSink(), tap: t})
}

// Err is the latest error noted; nil if none.
func (t *ErrorTap) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

func (t *ErrorTap) note(err error) {
	if err == nil {
		return
	}
	t.mu.Lock()
	t.err = err
	t.mu.Unlock()
}

// tapSink passes everything to inner (nil: nothing), and errors to the tap. It says it is enabled at every level,
// so that the errors of -v=2 lines reach the tap, and asks inner before passing a line on.
type tapSink struct {
	inner logr.LogSink
	tap   *ErrorTap
}

func (s tapSink) Init(info logr.RuntimeInfo) {
	if s.inner != nil {
		s.inner.Init(logr.RuntimeInfo{CallDepth: info.CallDepth + 1})
	}
}

func (s tapSink) Enabled(int) bool { return true }

func (s tapSink) Info(level int, msg string, kv ...any) {
	for i := 0; i+1 < len(kv); i += 2 {
		if key, _ := kv[i].(string); key == "error" || key == "err" {
			switch v := kv[i+1].(type) {
			case error:
				s.tap.note(v)
			case string:
				s.tap.note(errors.New(v))
			}
		}
	}
	if s.inner != nil && s.inner.Enabled(level) {
		s.inner.Info(level, msg, kv...)
	}
}

func (s tapSink) Error(err error, msg string, kv ...any) {
	s.tap.note(err)
	if s.inner != nil {
		s.inner.Error(err, msg, kv...)
	}
}

func (s tapSink) WithValues(kv ...any) logr.LogSink {
	if s.inner == nil {
		return s
	}
	return tapSink{inner: s.inner.WithValues(kv...), tap: s.tap}
}

func (s tapSink) WithName(name string) logr.LogSink {
	if s.inner == nil {
		return s
	}
	return tapSink{inner: s.inner.WithName(name), tap: s.tap}
}
