// Package flagcheck refuses, before a daemon starts anything, the flag values it could only misbehave with: a
// duration, an interval or a count that is not positive (a zero ticker panics, a zero timeout fails every call,
// a zero queue refuses everything), so that a typo stops the daemon at once, naming the flag, rather than
// surfacing hours later as a strange failure.
package flagcheck

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"time"
)

// Rules say which flags Check holds to what. Every time.Duration flag is checked without being named.
type Rules struct {
	// Counts are integer flags that must be above zero.
	Counts []string
	// ZeroOK are flags, durations, counts or numbers (float64), where zero has a documented meaning ("at once",
	// "no limit", "none"): only a negative value is refused.
	ZeroOK []string
}

// Check returns an error naming each flag of fs that breaks r, in fs's (lexical) order, or nil. A flag r names
// that fs lacks is an error too, so the rules cannot silently fall behind a renamed flag.
func Check(fs *flag.FlagSet, r Rules) error {
	counts, zeroOK := set(r.Counts), set(r.ZeroOK)
	var errs []error
	for _, name := range append(append([]string(nil), r.Counts...), r.ZeroOK...) {
		if fs.Lookup(name) == nil {
			errs = append(errs, fmt.Errorf("no flag --%s to check", name))
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		getter, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		value := getter.Get()
		sign, known := signOf(value)
		_, isDuration := value.(time.Duration)
		switch {
		case !known:
		case zeroOK[f.Name] && sign < 0:
			errs = append(errs, fmt.Errorf("--%s must not be negative, got %s", f.Name, f.Value.String()))
		case zeroOK[f.Name]:
		case (isDuration || counts[f.Name]) && sign <= 0:
			errs = append(errs, fmt.Errorf("--%s must be positive, got %s", f.Name, f.Value.String()))
		}
	})
	return errors.Join(errs...)
}

// DurationFlags names fs's time.Duration flags, which Check holds to its rules without being told: the daemons'
// tests set each one wrong to see that it is.
func DurationFlags(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, isDuration := g.Get().(time.Duration); isDuration {
				names = append(names, f.Name)
			}
		}
	})
	return names
}

// signOf is the sign (-1, 0, 1) of a flag's value, and whether the value is a number at all.
func signOf(value any) (int, bool) {
	var f float64
	switch v := value.(type) {
	case time.Duration:
		f = float64(v)
	case int:
		f = float64(v)
	case int64:
		f = float64(v)
	case uint:
		f = float64(v)
	case uint64:
		f = float64(v)
	case float64:
		f = v
	default:
		return 0, false
	}
	switch {
	case f < 0:
		return -1, true
	case f == 0:
		return 0, true
	}
	return 1, true
}

func set(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// BrokerURL refuses an MQTT broker URL the client could never dial: one that does not parse, a scheme the
// client does not speak, or no host (and, but for websockets, no port).
func BrokerURL(flagName, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		// Not the parser's message: it repeats the URL, a password in it too.
		return fmt.Errorf("--%s: not a URL; want tcp://<host>:<port> or ssl://<host>:<port>", flagName)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
		if u.Hostname() == "" || u.Port() == "" {
			return fmt.Errorf("--%s %q: want %s://<host>:<port>", flagName, u.Redacted(), u.Scheme)
		}
	case "ws", "wss":
		if u.Hostname() == "" {
			return fmt.Errorf("--%s %q: no host", flagName, u.Redacted())
		}
	default:
		return fmt.Errorf("--%s %q: the scheme must be tcp:// or ssl:// (or ws://, wss://)", flagName, u.Redacted())
	}
	return nil
}
