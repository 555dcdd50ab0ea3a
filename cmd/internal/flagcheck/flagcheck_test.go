package flagcheck

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	rules := Rules{Counts: []string{"queue", "bytes"}, ZeroOK: []string{"period", "rate", "burst"}}
	newSet := func() *flag.FlagSet {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Duration("interval", time.Second, "")
		fs.Duration("period", time.Second, "")
		fs.Int("queue", 64, "")
		fs.Int64("bytes", 1<<20, "")
		fs.Int("verbosity", 0, "") // not a count: zero and negatives are its business
		fs.Float64("rate", 5, "")
		fs.Uint("burst", 20, "")
		fs.String("name", "", "")
		return fs
	}
	tests := []struct {
		name string
		args []string
		want []string // substrings of the error, in order; none: no error
	}{
		{name: "defaults", args: nil},
		{name: "zero duration", args: []string{"--interval=0"}, want: []string{"--interval must be positive, got 0s"}},
		{name: "negative duration", args: []string{"--interval=-1s"}, want: []string{"--interval must be positive, got -1s"}},
		{name: "zero where zero means something", args: []string{"--period=0", "--rate=0", "--burst=0"}},
		{name: "negative where zero means something", args: []string{"--period=-1s", "--rate=-0.5"},
			want: []string{"--period must not be negative, got -1s", "--rate must not be negative, got -0.5"}},
		{name: "zero count", args: []string{"--queue=0"}, want: []string{"--queue must be positive, got 0"}},
		{name: "negative int64 count", args: []string{"--bytes=-5"}, want: []string{"--bytes must be positive, got -5"}},
		{name: "an integer that is not a count", args: []string{"--verbosity=-3"}},
		{name: "every offender, in lexical order", args: []string{"--queue=0", "--interval=0", "--bytes=0"},
			want: []string{"--bytes", "--interval", "--queue"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newSet()
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := Check(fs, rules)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Check: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check: nil, want an error with %q", tt.want)
			}
			rest := err.Error()
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("Check: %q, want %q (in order %q)", err, w, tt.want)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

// TestCheckNamesRulesWithoutAFlag: a rule for a flag that does not exist (renamed, removed) is an error, not a
// check that silently never runs.
func TestCheckNamesRulesWithoutAFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	err := Check(fs, Rules{Counts: []string{"report-queue"}})
	if err == nil || !strings.Contains(err.Error(), "no flag --report-queue") {
		t.Fatalf("Check: %v, want it to name --report-queue", err)
	}
}

func TestBrokerURL(t *testing.T) {
	tests := []struct {
		url  string
		want string // a substring of the error; empty: no error
	}{
		{url: "tcp://127.0.0.1:1883"},
		{url: "ssl://broker.example:8883"},
		{url: "mqtts://[::1]:8883"},
		{url: "wss://broker.example/mqtt"},
		{url: "127.0.0.1:1883", want: "not a URL"},
		{url: "broker.example", want: "the scheme must be"},
		{url: "http://broker.example:1883", want: "the scheme must be"},
		{url: "tcp://broker.example", want: "want tcp://<host>:<port>"},
		{url: "ssl://:8883", want: "want ssl://<host>:<port>"},
		{url: "tcp://user:secret@broker.example", want: "xxxxx"}, // the password is not repeated
		{url: "tcp://user:secret@bro ker:1", want: "--broker: not a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			err := BrokerURL("broker", tt.url)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("BrokerURL(%q): %v, want nil", tt.url, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("BrokerURL(%q): %v, want an error with %q", tt.url, err, tt.want)
			case err != nil && strings.Contains(err.Error(), "secret"):
				t.Fatalf("BrokerURL(%q): %v shows the password", tt.url, err)
			}
		})
	}
}
