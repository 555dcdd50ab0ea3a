package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/lifeline-edge/lifeline/cmd/internal/flagcheck"
)

// TestFlagValidation: a duration, or a count, that is not positive stops the controller before it starts,
// naming the flag; where zero has a meaning it is taken, and only a negative refused.
func TestFlagValidation(t *testing.T) {
	tests := []struct {
		args []string
		want string // a substring of the error; empty: valid
	}{
		{args: nil},
		{args: []string{"--mqtt-connect-timeout=0"}, want: "--mqtt-connect-timeout must be positive, got 0s"},
		{args: []string{"--log-level=debug", "--log-format=text"}},
		{args: []string{"--log-level=loud"}, want: `--log-level "loud" is none of error, info, debug, trace`},
		{args: []string{"--log-format=xml"}, want: `--log-format "xml" is neither json nor text`},
		{args: []string{"--zap-log-level=2"}}, // the old flag, now --log-level's alias
		{args: []string{"--mqtt-connect-timeout=-5s"}, want: "--mqtt-connect-timeout must be positive"},
		{args: []string{"--report-status-period=0"}},
		{args: []string{"--report-status-period=-1s"}, want: "--report-status-period must not be negative"},
		{args: []string{"--concurrent-reconciles=0"}, want: "--concurrent-reconciles must be positive, got 0"},
		{args: []string{"--mqtt-max-connections=-1"}, want: "--mqtt-max-connections must be positive"},
		{args: []string{"--memory-limit-fraction=0"}},
		{args: []string{"--memory-limit-fraction=-0.1"}, want: "--memory-limit-fraction must not be negative"},
		{args: []string{"--memory-limit-fraction=1.5"}, want: "--memory-limit-fraction must be at most 1"},
		{args: []string{"--mqtt-broker-url=tcp://mosquitto.example:1883"}},
		{args: []string{"--mqtt-broker-url=mosquitto.example:1883"}, want: "--mqtt-broker-url"},
		{args: []string{"--mqtt-broker-url=http://mosquitto.example:1883"}, want: "--mqtt-broker-url"},
		{args: []string{"--mqtt-tls-ca-secret=ca", "--mqtt-tls-ca-dir=/ca", "--mqtt-tls-namespace=ns", "--mqtt-tls-names=a,10.0.0.1"}},
		{args: []string{"--mqtt-tls-ca-secret=ca", "--mqtt-tls-ca-dir=/ca", "--mqtt-tls-namespace=ns", "--mqtt-tls-names=a", "--mqtt-broker-url=ssl://b:8883"},
			want: "no use with --mqtt-broker-url"},
		{args: []string{"--mqtt-tls-ca-secret=ca", "--mqtt-tls-ca-dir=/ca", "--mqtt-tls-namespace=ns"}, want: "needs --mqtt-tls-namespace, --mqtt-tls-ca-dir and --mqtt-tls-names"},
		{args: []string{"--mqtt-tls-ca-secret=ca", "--mqtt-tls-ca-dir=/ca", "--mqtt-tls-namespace=ns", "--mqtt-tls-names=a", "--mqtt-tls-cert=c.pem"},
			want: "leave out --mqtt-tls-cert"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("lifeline-controller", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c := bindFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := c.validate(fs)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("validate: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("validate: %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestReleaseRefusesANonPositiveStopTimeout: the release subcommand checks its flags before it touches the cluster.
func TestReleaseRefusesANonPositiveStopTimeout(t *testing.T) {
	err := release([]string{"--stop-timeout=0", "--kubeconfig=/nonexistent"})
	if err == nil || !strings.Contains(err.Error(), "--stop-timeout must be positive") {
		t.Fatalf("release: %v, want it to name --stop-timeout", err)
	}
}

// TestEveryDurationFlagIsChecked: no duration flag of the controller is let through at a negative value, so a new
// one cannot slip past validation.
func TestEveryDurationFlagIsChecked(t *testing.T) {
	fs := flag.NewFlagSet("lifeline-controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := bindFlags(fs)
	durations := flagcheck.DurationFlags(fs)
	if len(durations) < 2 {
		t.Fatalf("found only the duration flags %v", durations)
	}
	for _, name := range durations {
		if err := fs.Set(name, "-1s"); err != nil {
			t.Fatal(err)
		}
		if err := c.validate(fs); err == nil || !strings.Contains(err.Error(), "--"+name) {
			t.Errorf("--%s=-1s: validate said %v", name, err)
		}
		if err := fs.Set(name, "1s"); err != nil {
			t.Fatal(err)
		}
	}
}
