// Package logflags gives both daemons one set of logging flags and one log format: JSON (or text) lines with the
// keys time, level, msg and logger, levels by name.
package logflags

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/go-logr/logr"
)

// Options are what --log-level and --log-format say.
type Options struct {
	Level, Format string
}

// Bind defines --log-level and --log-format on fs.
func Bind(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.Level, "log-level", "info",
		"error, info, debug (the actions taken) or trace (every detail); or a verbosity from 0 (info) to 10")
	fs.StringVar(&o.Format, "log-format", "json", "json or text")
}

// levelNames are the named levels as logr verbosities; error shows errors alone.
var levelNames = map[string]int{"error": -1, "info": 0, "debug": 2, "trace": 4}

// Verbosity is the logr verbosity the level says; -1 for errors alone.
func (o Options) Verbosity() (int, error) {
	if v, ok := levelNames[o.Level]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(o.Level)
	if err != nil || v < 0 || v > 10 {
		return 0, fmt.Errorf("--log-level %q is none of error, info, debug, trace or a verbosity from 0 to 10", o.Level)
	}
	return v, nil
}

// Check refuses flags that could only fail later.
func (o Options) Check() error {
	if _, err := o.Verbosity(); err != nil {
		return err
	}
	if o.Format != "json" && o.Format != "text" {
		return fmt.Errorf("--log-format %q is neither json nor text", o.Format)
	}
	return nil
}

// Logger is the logger the flags say, writing to w.
func (o Options) Logger(w io.Writer) (logr.Logger, error) {
	if err := o.Check(); err != nil {
		return logr.Discard(), err
	}
	v, _ := o.Verbosity()
	level := slog.Level(-v)
	if v < 0 {
		level = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: nameLevel}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if o.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	return logr.FromSlogHandler(h), nil
}

// nameLevel writes a record's level by name: logr's V(1) to V(3) are debug, beyond trace; slog's own would be
// DEBUG+2 and the like.
func nameLevel(_ []string, a slog.Attr) slog.Attr {
	if a.Key != slog.LevelKey {
		return a
	}
	l, ok := a.Value.Any().(slog.Level)
	if !ok {
		return a
	}
	return slog.String(slog.LevelKey, LevelName(l))
}

// LevelName is a slog level's name in the daemons' logs.
func LevelName(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warn"
	case l >= slog.LevelInfo:
		return "info"
	case l >= slog.Level(-3):
		return "debug"
	}
	return "trace"
}
