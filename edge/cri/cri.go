// Package cri observes a node's workers through the container runtime's CRI socket (containerd by default), the
// way the kubelet sees them, and stops a container when the agent heals a worker. Every call has its own
// timeout and what comes back is validated.
package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultSocket is containerd's CRI socket, where edgecore's runtime listens on a keadm-joined node.
const DefaultSocket = "/run/containerd/containerd.sock"

// Labels the kubelet (edged) puts on every container it creates.
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// Container is the current attempt of one container of a pod.
type Container struct {
	ID       string
	Name     string
	Running  bool
	Exited   bool
	ExitCode int32
	// Attempt counts the container's restarts: the kubelet creates attempt n+1 after attempt n ended.
	Attempt    uint32
	StartedAt  time.Time
	FinishedAt time.Time
}

// Pod is what the runtime has of one pod.
type Pod struct {
	Namespace, Name, UID string
	Containers           []Container
	// SandboxStopped tells that the runtime holds the pod's sandboxes, none of them ready: its containers run
	// again only in a new sandbox, which the node's kubelet makes at once for a pod it knows and never for one it
	// does not (a kubelet booted while cut off knows none but its static pods). False when the runtime does not
	// say.
	SandboxStopped bool
}

// Client talks to a CRI runtime.
type Client struct {
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
	timeout time.Duration
}

// Dial connects to the runtime's unix socket; timeout bounds every call.
func Dial(socket string, timeout time.Duration) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(socket, "unix://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to CRI socket %s: %w", socket, err)
	}
	return &Client{conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn), images: runtimeapi.NewImageServiceClient(conn),
		timeout: timeout}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Pods lists the pods that have containers in the runtime, with the latest attempt of each container.
func (c *Client) Pods(ctx context.Context) ([]Pod, error) {
	list, err := call(ctx, c.timeout, func(ctx context.Context) (*runtimeapi.ListContainersResponse, error) {
		return c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	})
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	latest := map[string]*runtimeapi.Container{} // pod uid + container name -> latest attempt
	for _, ctr := range list.GetContainers() {
		l := ctr.GetLabels()
		if l[labelPodUID] == "" || l[labelContainerName] == "" || ctr.GetId() == "" {
			continue // not a pod's container, or a runtime answer we cannot use
		}
		key := l[labelPodUID] + "/" + l[labelContainerName]
		if cur, ok := latest[key]; !ok || ctr.GetMetadata().GetAttempt() >= cur.GetMetadata().GetAttempt() {
			latest[key] = ctr
		}
	}
	pods := map[string]*Pod{}
	for _, ctr := range latest {
		l := ctr.GetLabels()
		p := pods[l[labelPodUID]]
		if p == nil {
			p = &Pod{Namespace: l[labelPodNamespace], Name: l[labelPodName], UID: l[labelPodUID]}
			pods[p.UID] = p
		}
		container, err := c.describe(ctx, ctr)
		if err != nil {
			return nil, err
		}
		p.Containers = append(p.Containers, container)
	}
	stopped, err := c.stoppedSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Pod, 0, len(pods))
	for _, p := range pods {
		p.SandboxStopped = stopped[p.UID]
		sort.Slice(p.Containers, func(i, j int) bool { return p.Containers[i].Name < p.Containers[j].Name })
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out, nil
}

// stoppedSandboxes are the pods (by UID) whose sandboxes the runtime holds, none of them ready; none when the
// runtime does not list sandboxes.
func (c *Client) stoppedSandboxes(ctx context.Context) (map[string]bool, error) {
	list, err := call(ctx, c.timeout, func(ctx context.Context) (*runtimeapi.ListPodSandboxResponse, error) {
		return c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	})
	if status.Code(err) == codes.Unimplemented {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing pod sandboxes: %w", err)
	}
	stopped := map[string]bool{}
	for _, sb := range list.GetItems() {
		uid := sb.GetMetadata().GetUid()
		if uid == "" {
			continue
		}
		ready := sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY
		if was, seen := stopped[uid]; !seen || was {
			stopped[uid] = !ready
		}
	}
	return stopped, nil
}

// describe completes a listed container. Only an exited one needs ContainerStatus (its exit code is only
// there), so an idle node with running workers costs one call per poll.
func (c *Client) describe(ctx context.Context, ctr *runtimeapi.Container) (Container, error) {
	out := Container{ID: ctr.GetId(), Name: ctr.GetLabels()[labelContainerName], Attempt: ctr.GetMetadata().GetAttempt(),
		Running: ctr.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING}
	if ctr.GetCreatedAt() > 0 {
		out.StartedAt = time.Unix(0, ctr.GetCreatedAt())
	}
	if ctr.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		return out, nil
	}
	st, err := call(ctx, c.timeout, func(ctx context.Context) (*runtimeapi.ContainerStatusResponse, error) {
		return c.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ctr.GetId()})
	})
	if err != nil {
		return out, fmt.Errorf("reading status of container %s: %w", ctr.GetId(), err)
	}
	s := st.GetStatus()
	if s == nil {
		return out, fmt.Errorf("runtime returned no status for container %s", ctr.GetId())
	}
	out.Exited = s.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED
	out.Running = s.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING
	out.ExitCode = s.GetExitCode()
	if s.GetStartedAt() > 0 {
		out.StartedAt = time.Unix(0, s.GetStartedAt())
	}
	if s.GetFinishedAt() > 0 {
		out.FinishedAt = time.Unix(0, s.GetFinishedAt())
	}
	return out, nil
}

// StopContainer stops a container; the kubelet (edged) then restarts it by the pod's restart policy.
func (c *Client) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	_, err := call(ctx, c.timeout+grace, func(ctx context.Context) (*runtimeapi.StopContainerResponse, error) {
		return c.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(grace / time.Second)})
	})
	if err != nil {
		return fmt.Errorf("stopping container %s: %w", id, err)
	}
	return nil
}

// ImageCommand is what image runs when a container names no command, from the image's configuration: the
// runtime's verbose image status carries it (containerd's "info", imageSpec.config), since CRI has no field for
// it. An image the node does not have is an error.
func (c *Client) ImageCommand(ctx context.Context, image string) (entrypoint, cmd []string, err error) {
	st, err := call(ctx, c.timeout, func(ctx context.Context) (*runtimeapi.ImageStatusResponse, error) {
		return c.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}, Verbose: true})
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading the status of image %s: %w", image, err)
	}
	if st.GetImage() == nil {
		return nil, nil, fmt.Errorf("image %s is not on the node", image)
	}
	var info struct {
		ImageSpec struct {
			Config struct{ Entrypoint, Cmd []string } `json:"config"`
		} `json:"imageSpec"`
	}
	raw, ok := st.GetInfo()["info"]
	if !ok {
		return nil, nil, fmt.Errorf("the runtime tells nothing of what image %s runs (no verbose info)", image)
	}
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return nil, nil, fmt.Errorf("reading what image %s runs: %w", image, err)
	}
	return info.ImageSpec.Config.Entrypoint, info.ImageSpec.Config.Cmd, nil
}

// call runs one RPC with its own timeout.
func call[T any](ctx context.Context, timeout time.Duration, rpc func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rpc(ctx)
}

// WatchEvents follows the runtime's container events (CRI GetContainerEvents) and sends on changed after each,
// until ctx ends or the stream breaks; it returns the error that ended it. A runtime without events answers
// codes.Unimplemented at once.
func (c *Client) WatchEvents(ctx context.Context, changed chan<- struct{}) error {
	stream, err := c.runtime.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return fmt.Errorf("container events: %w", err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return fmt.Errorf("container events: %w", err)
		}
		select {
		case changed <- struct{}{}:
		default: // a signal is pending already: the next read sees this change too
		}
	}
}
