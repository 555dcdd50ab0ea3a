package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// KillContainer kills, with SIGKILL, the process of the pod's running container on the node, as the kernel's OOM
// killer or a crash would end it, found through the node's own container runtime. It returns the killed PID.
func (n *Node) KillContainer(ctx context.Context, pod, container string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var pid int
	err := n.withRuntime(func(rt runtimeapi.RuntimeServiceClient) error {
		running, err := runningContainers(ctx, rt, map[string]string{"io.kubernetes.pod.name": pod, "io.kubernetes.container.name": container})
		if err != nil {
			return err
		}
		if len(running) != 1 {
			return fmt.Errorf("%d containers %s of pod %s run, not one", len(running), container, pod)
		}
		if pid, err = containerPID(ctx, rt, running[0].Id); err == nil && pid == 0 {
			err = fmt.Errorf("container %s of pod %s ended before it was killed", container, pod)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("killing PID %d: %w", pid, err)
	}
	return pid, nil
}

// containerPID is the PID of a running container's process, from its verbose status: 0 when the container has
// ended since it was listed (its status gone, or no process). A runtime that does not answer is an error, not a
// container that ended: a count made without it would be short.
func containerPID(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) (int, error) {
	status, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	switch {
	case grpcstatus.Code(err) == codes.NotFound:
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("container %s: %w", id, err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if json.Unmarshal([]byte(status.Info["info"]), &info) != nil || info.PID <= 0 || syscall.Kill(info.PID, 0) != nil {
		return 0, nil
	}
	return info.PID, nil
}

// runningAs tells whether a container listed running still runs, and whether it runs an armed stand-in's gate
// (testkit.AtGate) rather than its command.
func runningAs(ctx context.Context, rt runtimeapi.RuntimeServiceClient, c *runtimeapi.Container) (running, atGate bool, err error) {
	pid, err := containerPID(ctx, rt, c.Id)
	if err != nil || pid == 0 {
		return false, false, err
	}
	return true, testkit.AtGate(pid), nil
}

// RunningContainers counts the containers of pods whose name starts with podPrefix that run on the node, as its
// runtime says (static pods are named <pod>-<node>).
func (n *Node) RunningContainers(ctx context.Context, podPrefix string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	count := 0
	err := n.withRuntime(func(rt runtimeapi.RuntimeServiceClient) error {
		running, err := runningContainers(ctx, rt, nil)
		if err != nil {
			return err
		}
		for _, c := range running {
			if !strings.HasPrefix(c.Labels["io.kubernetes.pod.name"], podPrefix) {
				continue
			}
			// An armed stand-in's container at its gate is no instance of its worker.
			running, atGate, err := runningAs(ctx, rt, c)
			if err != nil {
				return err
			}
			if running && !atGate {
				count++
			}
		}
		return nil
	})
	return count, err
}

// withRuntime calls use with a client of the node's container runtime.
func (n *Node) withRuntime(use func(runtimeapi.RuntimeServiceClient) error) error {
	conn, err := grpc.NewClient("unix://"+n.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("node %s's runtime: %w", n.Name, err)
	}
	defer conn.Close()
	if err := use(runtimeapi.NewRuntimeServiceClient(conn)); err != nil {
		return fmt.Errorf("node %s's runtime: %w", n.Name, err)
	}
	return nil
}

func runningContainers(ctx context.Context, rt runtimeapi.RuntimeServiceClient, labels map[string]string) ([]*runtimeapi.Container, error) {
	list, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: labels,
	}})
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	return list.Containers, nil
}

// TagImage gives an image the node has a second name, as a registry serving the same image under a new tag would.
func (n *Node) TagImage(ctx context.Context, from, to string) error {
	if err := run(ctx, "ctr", "--address", n.CRISocket, "-n", "k8s.io", "images", "tag", "--force", from, to); err != nil {
		return fmt.Errorf("node %s: tagging %s as %s: %w", n.Name, from, to, err)
	}
	return nil
}

// GateRunning tells whether an armed stand-in of the worker whose pod is named pod runs its gate on the node: the
// stand-in is armed, its mirror pod made, and a rebuild only has to open it.
func (n *Node) GateRunning(ctx context.Context, pod string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	found := false
	err := n.withRuntime(func(rt runtimeapi.RuntimeServiceClient) error {
		for _, standIn := range lifelinev1.StandInPodsOn(pod, n.Name) {
			running, err := runningContainers(ctx, rt, map[string]string{"io.kubernetes.pod.name": standIn})
			if err != nil {
				return err
			}
			for _, c := range running {
				_, atGate, err := runningAs(ctx, rt, c)
				if err != nil {
					return err
				}
				found = found || atGate
			}
		}
		return nil
	})
	return found, err
}

// StandInContainers counts the running containers of the stand-ins of the worker whose pod is named pod (static
// pods named <stand-in>-<node>, lifelinev1.StandInPodsOn), their gates not counted.
func (n *Node) StandInContainers(ctx context.Context, pod string) (int, error) {
	count := 0
	for _, standIn := range lifelinev1.StandInPodsOn(pod, n.Name) {
		c, err := n.RunningContainers(ctx, standIn)
		if err != nil {
			return 0, err
		}
		count += c
	}
	return count, nil
}
