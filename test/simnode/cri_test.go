package simnode

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The hollow node's CRI subset shows its processes as the agent's CRI client reads a real runtime, and stopping
// a container ends its process.
func TestCRISubsetServesTheNodesProcesses(t *testing.T) {
	dir := t.TempDir()
	n := New(Config{NodeName: "edge-1", StateDir: dir})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "uid-1"}}
	proc, err := startProcess([]string{"sleep", "30"}, nil, dir, filepath.Join(dir, "log"), filepath.Join(dir, "pid"),
		func() { n.containerChanged(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT) })
	if err != nil {
		t.Fatal(err)
	}
	defer proc.stop(0)
	n.pods[pod.UID] = &podRuntime{pod: pod, procs: map[string]*process{"main": proc}, restarts: map[string]int32{"main": 2},
		nextStart: map[string]time.Time{}, lastExit: map[string]*corev1.ContainerStateTerminated{}}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	socket := filepath.Join(dir, "cri.sock")
	go func() { _ = n.ServeCRI(ctx, socket) }()
	client, err := cri.Dial(socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	var pods []cri.Pod
	testkit.UntilErr(t, 5*time.Second, "the CRI socket answering", func(ctx context.Context) (bool, error) {
		var err error
		pods, err = client.Pods(ctx)
		return err == nil, err
	})
	if len(pods) != 1 || len(pods[0].Containers) != 1 {
		t.Fatalf("pods %+v", pods)
	}
	events := make(chan struct{}, 1)
	go func() { _ = client.WatchEvents(ctx, events) }()
	testkit.Until(t, 5*time.Second, "the node serving the event stream", func() bool {
		n.eventsMu.Lock()
		defer n.eventsMu.Unlock()
		return len(n.eventSubs) == 1
	})
	c := pods[0].Containers[0]
	if pods[0].UID != "uid-1" || pods[0].Name != "w" || c.Name != "main" || !c.Running || c.Attempt != 2 {
		t.Errorf("seen %+v / %+v", pods[0], c)
	}
	if err := client.StopContainer(ctx, c.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-events:
	case <-time.After(5 * time.Second):
		t.Error("no container event for the container's exit")
	}
	pods, err = client.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := pods[0].Containers[0]; c.Running || !c.Exited || c.ExitCode != 128+15 {
		t.Errorf("after StopContainer: %+v, want exited by SIGTERM", c)
	}
}
