package cri

import (
	"context"
	"slices"
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

// What an image runs is read from the runtime's verbose image status, where containerd tells the image's
// configuration; an image the node does not have, or a status without it, is an error.
func TestImageCommandIsReadFromTheImagesConfiguration(t *testing.T) {
	rt, err := simnode.StartCRI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	rt.SetImage("trainer:1", `{"chainID":"sha256:c","imageSpec":{"architecture":"amd64","config":{"Env":["PATH=/bin"],"Entrypoint":["/train"],"Cmd":["--epochs","1"]}}}`)
	rt.SetImage("bare:1", `{"imageSpec":{"config":{}}}`)
	rt.SetImage("opaque:1", `not json`)
	c, err := Dial(rt.Socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	entrypoint, cmd, err := c.ImageCommand(context.Background(), "trainer:1")
	if err != nil || !slices.Equal(entrypoint, []string{"/train"}) || !slices.Equal(cmd, []string{"--epochs", "1"}) {
		t.Errorf("trainer:1 runs %q %q (%v), want its entrypoint and Cmd", entrypoint, cmd, err)
	}
	if entrypoint, cmd, err := c.ImageCommand(context.Background(), "bare:1"); err != nil || entrypoint != nil || cmd != nil {
		t.Errorf("an image that names no command: %q %q (%v), want nothing and no error", entrypoint, cmd, err)
	}
	for _, image := range []string{"missing:1", "opaque:1"} {
		if _, _, err := c.ImageCommand(context.Background(), image); err == nil {
			t.Errorf("%s: no error", image)
		}
	}
}
