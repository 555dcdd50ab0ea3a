package simnode

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criServer serves the part of the CRI RuntimeService the edge agent calls, over the node's processes: a
// container's ID is <pod uid>/<container>/<attempt>, its labels those the kubelet sets.
type criServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	node *Node
}

// ServeCRI serves the runtime on a unix socket until ctx ends.
func (n *Node) ServeCRI(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return fmt.Errorf("creating the CRI socket's directory: %w", err)
	}
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on CRI socket %s: %w", socket, err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, &criServer{node: n})
	runtimeapi.RegisterImageServiceServer(srv, &imageServer{node: n})
	go func() { <-ctx.Done(); srv.Stop() }()
	return srv.Serve(l)
}

// imageServer serves the image status the edge agent reads, as containerd tells it: an image the node maps to a
// command has that command as its entrypoint, in the verbose info's imageSpec.config; one it does not map is not
// on the node.
type imageServer struct {
	runtimeapi.UnimplementedImageServiceServer
	node *Node
}

// ImageStatus tells of a mapped image.
func (s *imageServer) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	ref := req.GetImage().GetImage()
	argv, ok := s.node.cfg.Images[imageName(ref)]
	if !ok {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	info, err := json.Marshal(map[string]any{"imageSpec": map[string]any{"config": map[string]any{"Entrypoint": argv}}})
	if err != nil {
		return nil, err
	}
	return imageStatus(req, string(info)), nil
}

// imageStatus answers req for an image the node has, with info as the verbose status' "info" when asked for.
func imageStatus(req *runtimeapi.ImageStatusRequest, info string) *runtimeapi.ImageStatusResponse {
	ref := req.GetImage().GetImage()
	out := &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:" + imageName(ref), RepoTags: []string{ref}}}
	if req.GetVerbose() {
		out.Info = map[string]string{"info": info}
	}
	return out
}

// Version names the hollow runtime.
func (s *criServer) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "lifeline-edgesim", RuntimeVersion: "0.1.0", RuntimeApiVersion: "v1"}, nil
}

// ListContainers lists the current process of every container the node has started.
func (s *criServer) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	out := &runtimeapi.ListContainersResponse{}
	s.node.eachContainer(func(rt *podRuntime, name string, p *process) {
		running, _, started, _ := p.state()
		state := runtimeapi.ContainerState_CONTAINER_EXITED
		if running {
			state = runtimeapi.ContainerState_CONTAINER_RUNNING
		}
		out.Containers = append(out.Containers, &runtimeapi.Container{
			Id:        containerID(rt, name),
			Metadata:  &runtimeapi.ContainerMetadata{Name: name, Attempt: uint32(rt.restarts[name])},
			State:     state,
			CreatedAt: started.UnixNano(),
			Labels: map[string]string{
				"io.kubernetes.pod.name": rt.pod.Name, "io.kubernetes.pod.namespace": rt.pod.Namespace,
				"io.kubernetes.pod.uid": string(rt.pod.UID), "io.kubernetes.container.name": name,
			},
		})
	})
	return out, nil
}

// ContainerStatus reports one container's process.
func (s *criServer) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	name, attempt, p := s.node.findContainer(req.GetContainerId())
	if p == nil {
		return nil, status.Errorf(codes.NotFound, "no container %s", req.GetContainerId())
	}
	running, code, started, finished := p.state()
	st := &runtimeapi.ContainerStatus{Id: req.GetContainerId(), StartedAt: started.UnixNano(),
		Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: uint32(attempt)}}
	if running {
		st.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	} else {
		st.State, st.ExitCode, st.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, int32(code), finished.UnixNano()
	}
	return &runtimeapi.ContainerStatusResponse{Status: st}, nil
}

// StopContainer stops a container's process; the node's restart policy decides what happens next, as edged's.
func (s *criServer) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	_, _, p := s.node.findContainer(req.GetContainerId())
	if p == nil {
		return nil, status.Errorf(codes.NotFound, "no container %s", req.GetContainerId())
	}
	p.stop(time.Duration(req.GetTimeout()) * time.Second)
	return &runtimeapi.StopContainerResponse{}, nil
}

// GetContainerEvents streams an event whenever a container starts or exits; the agent reads the runtime again
// on each.
func (s *criServer) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	changed := make(chan runtimeapi.ContainerEventType, 16)
	s.node.eventsMu.Lock()
	s.node.eventSubs[changed] = true
	s.node.eventsMu.Unlock()
	defer func() {
		s.node.eventsMu.Lock()
		delete(s.node.eventSubs, changed)
		s.node.eventsMu.Unlock()
	}()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case kind := <-changed:
			if err := stream.Send(&runtimeapi.ContainerEventResponse{ContainerEventType: kind, CreatedAt: time.Now().UnixNano()}); err != nil {
				return err
			}
		}
	}
}

// containerChanged tells the event streams that a container started or exited; a stream that is far behind
// misses events, as a CRI client must expect.
func (n *Node) containerChanged(kind runtimeapi.ContainerEventType) {
	n.eventsMu.Lock()
	defer n.eventsMu.Unlock()
	for ch := range n.eventSubs {
		select {
		case ch <- kind:
		default:
		}
	}
}

func containerID(rt *podRuntime, name string) string {
	return string(rt.pod.UID) + "/" + name + "/" + strconv.Itoa(int(rt.restarts[name]))
}

// eachContainer visits the current process of every container, under the node's and the pod's locks.
func (n *Node) eachContainer(visit func(rt *podRuntime, name string, p *process)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, rt := range n.pods {
		rt.mu.Lock()
		for name, p := range rt.procs {
			visit(rt, name, p)
		}
		rt.mu.Unlock()
	}
}

// findContainer resolves a container ID to its name, attempt and process; only the current attempt is known.
func (n *Node) findContainer(id string) (string, int32, *process) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return "", 0, nil
	}
	var attempt int32
	var proc *process
	n.eachContainer(func(rt *podRuntime, name string, p *process) {
		if string(rt.pod.UID) == parts[0] && name == parts[1] && containerID(rt, name) == id {
			attempt, proc = rt.restarts[name], p
		}
	})
	return parts[1], attempt, proc
}
