package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/lifeline-edge/lifeline/cmd/internal/flagcheck"
)

// TestFlagValidation: every duration flag, and every count, that is not positive stops the agent before it
// starts, naming the flag; where zero has a meaning it is taken, and only a negative refused.
func TestFlagValidation(t *testing.T) {
	tests := []struct {
		args []string
		want string // a substring of the error; empty: valid
	}{
		{args: nil},
		{args: []string{"--poll-interval=0"}, want: "--poll-interval must be positive, got 0s"},
		{args: []string{"--heal-api-grace=-1s"}, want: "--heal-api-grace must be positive, got -1s"},
		{args: []string{"--heal-dead-for=0"}, want: "--heal-dead-for must be positive"},
		{args: []string{"--heal-controller-wait=0"}, want: "--heal-controller-wait must be positive"},
		{args: []string{"--heartbeat-interval=0"}, want: "--heartbeat-interval must be positive"},
		{args: []string{"--heartbeat-interval=1m"}, want: "--heartbeat-interval:"}, // within 250 ms..30 s
		{args: []string{"--broker-retry-max=0"}, want: "--broker-retry-max must be positive"},
		{args: []string{"--dataset-count-interval=0"}, want: "--dataset-count-interval must be positive"},
		{args: []string{"--dataset-count-timeout=-5s"}, want: "--dataset-count-timeout must be positive"},
		{args: []string{"--max-journaled-reports=0"}, want: "--max-journaled-reports must be positive, got 0"},
		{args: []string{"--max-journaled-report-bytes=0"}, want: "--max-journaled-report-bytes must be positive"},
		{args: []string{"--report-queue=-1"}, want: "--report-queue must be positive"},
		{args: []string{"--report-max-connections=0"}, want: "--report-max-connections must be positive"},
		{args: []string{"--report-burst=0"}, want: "--report-burst must be positive"},
		{args: []string{"--dataset-index-max-bytes=0"}, want: "--dataset-index-max-bytes must be positive"},
		{args: []string{"--report-rate=0"}},
		{args: []string{"--report-rate=-1"}, want: "--report-rate must not be negative"},
		{args: []string{"--memory-limit-fraction=0"}},
		{args: []string{"--memory-limit-fraction=2"}, want: "--memory-limit-fraction must be at most 1"},
		{args: []string{"--broker=ssl://broker.example:30883"}},
		{args: []string{"--broker=broker.example:30883"}, want: "--broker"},
		{args: []string{"--broker=tcp://broker.example"}, want: "--broker"},
		{args: []string{"--forward-unowned-reports-to=127.0.0.1:9100"}, want: "--forward-unowned-reports-to"},
		{args: []string{"--node-name="}, want: "--node-name (or $NODE_NAME) is required"},
		{args: []string{"--cloud-probe=https://cloudcore:10002/ca.crt", "--cloud-probe-period=1s", "--cloud-probe-timeout=2s"}},
		{args: []string{"--cloud-probe=cloudcore:10002"}, want: `--cloud-probe: "cloudcore:10002" is not an http(s) URL`},
		{args: []string{"--cloud-probe=http://cloudcore:10002/ca.crt"}, want: "not HTTPS"},
		{args: []string{"--insecure-pod-source-host-paths=/data,relative"}, want: `"relative" is not a directory below /`},
		{args: []string{"--cloud-probe-period=0s"}, want: "--cloud-probe-period"},
		{args: []string{"--log-level=debug", "--log-format=text"}},
		{args: []string{"--log-level=loud"}, want: `--log-level "loud" is none of error, info, debug, trace`},
		{args: []string{"--log-format=xml"}, want: `--log-format "xml" is neither json nor text`},
		{args: []string{"--v=3"}}, // the old flag, now --log-level's alias
		{args: []string{"--v=12"}, want: `--log-level "12"`},
		{args: []string{"--standby", "--static-pod-dir=/etc/kubernetes/manifests"}},
		{args: []string{"--standby", "--static-pod-dir="}, want: "--standby needs --static-pod-dir"},
		{args: []string{"--standby", "--standby-manifest=/etc/lifeline/standby/pod.yaml"}, want: "--standby and --standby-manifest"},
		{args: []string{"--standby-manifest=/etc/lifeline/standby/pod.yaml", "--in-cluster", "--static-pod-dir=/etc/kubernetes/manifests"}},
		{args: []string{"--standby-manifest=/etc/lifeline/standby/pod.yaml"}, want: "--standby-manifest needs --in-cluster"},
		{args: []string{"--daemonset=lifeline-agent"}, want: `--daemonset "lifeline-agent" is not NAMESPACE/NAME`},
		{args: []string{"--daemonset=lifeline-system/lifeline-agent"}},
		// Several at once: each is named.
		{args: []string{"--poll-interval=0", "--report-queue=0"}, want: "--poll-interval must be positive, got 0s\n--report-queue must be positive"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("lifeline-agent", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o := bindFlags(fs)
			err := fs.Parse(append([]string{"--node-name=edge-1"}, tt.args...))
			if err == nil {
				err = o.validate(fs)
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("validate: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("validate: %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestEveryDurationFlagIsChecked: the agent has no duration flag that validation lets through at zero, so a new
// one cannot slip past it.
func TestEveryDurationFlagIsChecked(t *testing.T) {
	fs := flag.NewFlagSet("lifeline-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := bindFlags(fs)
	durations := flagcheck.DurationFlags(fs)
	if len(durations) < 8 {
		t.Fatalf("found only the duration flags %v", durations)
	}
	for _, name := range durations {
		if err := fs.Set(name, "0s"); err != nil {
			t.Fatal(err)
		}
		o.node = "edge-1"
		if err := o.validate(fs); err == nil || !strings.Contains(err.Error(), "--"+name) {
			t.Errorf("--%s=0s: validate said %v", name, err)
		}
		if err := fs.Set(name, "1s"); err != nil {
			t.Fatal(err)
		}
	}
}
