package cri

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/lifeline-edge/lifeline/test/simnode"
)

func TestPodsTakesTheLatestAttemptWithItsExitCode(t *testing.T) {
	rt, err := simnode.StartCRI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	pod := func(id string, attempt uint32, state runtimeapi.ContainerState, code int32) simnode.CRIContainer {
		return simnode.CRIContainer{ID: id, PodNamespace: "default", PodName: "sdd-trainworker-0", PodUID: "uid-1",
			Name: "train-worker", Attempt: attempt, State: state, ExitCode: code, FinishedAt: 5}
	}
	rt.Set(pod("c0", 0, runtimeapi.ContainerState_CONTAINER_EXITED, 1))
	rt.Set(pod("c1", 1, runtimeapi.ContainerState_CONTAINER_EXITED, 2))
	rt.Set(simnode.CRIContainer{ID: "sandbox-pause"}) // no pod labels: not a worker container

	c, err := Dial(rt.Socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pods, err := c.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || len(pods[0].Containers) != 1 {
		t.Fatalf("pods %+v, want one pod with one container", pods)
	}
	got := pods[0].Containers[0]
	if got.ID != "c1" || got.Attempt != 1 || !got.Exited || got.ExitCode != 2 || got.Running {
		t.Errorf("container %+v, want attempt 1 exited with 2", got)
	}
	if pods[0].SandboxStopped {
		t.Error("a pod whose sandboxes the runtime does not list is taken as stopped")
	}
	rt.SetSandbox("uid-1", false)
	if pods, err = c.Pods(context.Background()); err != nil || !pods[0].SandboxStopped {
		t.Errorf("a pod whose only sandbox is not ready: %+v, %v; want its sandbox stopped", pods, err)
	}
	rt.SetSandbox("uid-1", true)
	if pods, err = c.Pods(context.Background()); err != nil || pods[0].SandboxStopped {
		t.Errorf("a pod whose sandbox is ready: %+v, %v; want it not stopped", pods, err)
	}
	if err := c.StopContainer(context.Background(), "c1", time.Second); err != nil {
		t.Fatal(err)
	}
	if s := rt.Stopped(); len(s) != 1 || s[0] != "c1" {
		t.Errorf("stopped %v", s)
	}
	if err := c.StopContainer(context.Background(), "missing", time.Second); err == nil {
		t.Error("stopping a missing container succeeded")
	}
}

func TestEveryCallHasItsTimeout(t *testing.T) {
	// Nothing listens on this socket: the call fails within its timeout instead of hanging.
	c, err := Dial(t.TempDir()+"/nothing.sock", 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	if _, err := c.Pods(context.Background()); err == nil {
		t.Fatal("listing from a missing runtime succeeded")
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("the call took %v", took)
	}
}
