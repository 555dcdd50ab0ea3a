package broker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/edge/agent"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// mosquittoLimits are the limits docs/operations.md gives for mosquitto (its listener aside).
const mosquittoLimits = `max_packet_size 67584
max_inflight_messages 64
max_queued_messages 64
max_queued_bytes 1048576
max_keepalive 60
use_username_as_clientid true
max_connections 1000
`

// With mosquitto as the broker, bounded as docs/operations.md says: the agent's states reach the controller's
// table, retained ones included for a controller that connects later, and the controller's commands reach the
// agent.
func TestControllerReadsAndCommandsThroughMosquitto(t *testing.T) {
	addr := testkit.StartMosquitto(t, "cloud", mosquittoLimits)
	state := t.TempDir()
	j, err := journal.Open(filepath.Join(state, "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	commands := make(chan []byte, 4)
	pub := publisher.New(publisher.Config{Broker: "tcp://" + addr, Username: "edge1", Cluster: "c", Node: "edge1", StateDir: state,
		RetryInterval: 100 * time.Millisecond, OnCommand: func(p []byte) { commands <- p }}, j)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testkit.Background(t, ctx, pub.Run)
	testkit.Until(t, 5*time.Second, "the agent connected", pub.Connected)
	// A worker state published before the controller connects: retained, so the controller still learns it.
	obs, err := agent.New(agent.Config{Cluster: "c", Node: "edge1", Publisher: pub, Store: j, Source: staticPods{}, Workers: staticPods{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.ObserveOnce(ctx); err != nil {
		t.Fatal(err)
	}
	go agent.Heartbeats(ctx, "c", "edge1", 100*time.Millisecond, pub, agent.HeartbeatFacts{APIReachable: func() bool { return false }})

	reg := prometheus.NewRegistry()
	tracker, err := liveness.NewTracker("c", reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ext, err := Connect(ExternalConfig{URL: "tcp://" + addr, Username: "lifeline-controller", Cluster: "c", Tracker: tracker})
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "u1"}, Spec: corev1.PodSpec{NodeName: "edge1"}}
	testkit.Until(t, 5*time.Second, "the agent's retained worker state in the controller's table", func() bool {
		return tracker.ViewOf(pod, false, time.Now()).Truth == liveness.TruthAgent
	})
	if err := ext.PublishCommand("edge1", []byte("restart")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-commands:
		if string(got) != "restart" {
			t.Errorf("command %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the command did not reach the agent")
	}
}

// staticPods is a runtime with one running worker, and the node's workers.
type staticPods struct{}

func (staticPods) Workers() []desired.Worker {
	return []desired.Worker{{Namespace: "default", Name: "w", UID: "u1"}}
}

func (staticPods) Pods(context.Context) ([]cri.Pod, error) {
	return []cri.Pod{{Namespace: "default", Name: "w", UID: "u1", Containers: []cri.Container{{ID: "c1", Name: "main", Running: true}}}}, nil
}
