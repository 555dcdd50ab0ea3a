package simnode

import (
	"context"
	"net"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRIContainer is one container the fake runtime reports.
type CRIContainer struct {
	ID, PodNamespace, PodName, PodUID, Name string
	Attempt                                 uint32
	State                                   runtimeapi.ContainerState
	ExitCode                                int32
	StartedAt, FinishedAt                   int64
}

// CRI is the fake runtime.
type CRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	mu         sync.Mutex
	containers map[string]CRIContainer
	images     map[string]string // image -> its verbose status' "info", as containerd tells it
	sandboxes  map[string]bool   // pod UID -> ready; pods absent have none listed
	stopped    []string

	server *grpc.Server
	// Socket is the unix socket the runtime serves on.
	Socket string
}

// StartCRI serves a fake runtime on a socket in dir.
func StartCRI(dir string) (*CRI, error) {
	r := &CRI{containers: map[string]CRIContainer{}, sandboxes: map[string]bool{}, Socket: filepath.Join(dir, "cri.sock")}
	l, err := net.Listen("unix", r.Socket)
	if err != nil {
		return nil, err
	}
	r.server = grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(r.server, r)
	runtimeapi.RegisterImageServiceServer(r.server, fakeImages{r: r})
	go func() { _ = r.server.Serve(l) }()
	return r, nil
}

// SetImage puts an image on the node, its verbose status' "info" as given.
func (r *CRI) SetImage(image, info string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.images == nil {
		r.images = map[string]string{}
	}
	r.images[image] = info
}

// fakeImages serves the fake runtime's images.
type fakeImages struct {
	runtimeapi.UnimplementedImageServiceServer
	r *CRI
}

// ImageStatus tells of an image set, with its info when verbose; of another, nothing (not on the node).
func (f fakeImages) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	info, ok := f.r.images[req.GetImage().GetImage()]
	if !ok {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return imageStatus(req, info), nil
}

// Stop stops serving.
func (r *CRI) Stop() { r.server.Stop() }

// Set adds or replaces a container.
func (r *CRI) Set(c CRIContainer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.containers[c.ID] = c
}

// SetSandbox gives the pod podUID one sandbox, ready or stopped.
func (r *CRI) SetSandbox(podUID string, ready bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sandboxes[podUID] = ready
}

// ListPodSandbox lists the sandboxes SetSandbox set.
func (r *CRI) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &runtimeapi.ListPodSandboxResponse{}
	for uid, ready := range r.sandboxes {
		state := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		if ready {
			state = runtimeapi.PodSandboxState_SANDBOX_READY
		}
		out.Items = append(out.Items, &runtimeapi.PodSandbox{Id: "sandbox-" + uid, Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid}, State: state})
	}
	return out, nil
}

// Stopped lists the containers StopContainer was called for.
func (r *CRI) Stopped() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.stopped...)
}

// Version answers who the runtime is.
func (r *CRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fakecri", RuntimeVersion: "0.1.0", RuntimeApiVersion: "v1"}, nil
}

// ListContainers lists every container.
func (r *CRI) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &runtimeapi.ListContainersResponse{}
	for _, c := range r.containers {
		out.Containers = append(out.Containers, &runtimeapi.Container{
			Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt}, State: c.State,
			Labels: map[string]string{
				"io.kubernetes.pod.name": c.PodName, "io.kubernetes.pod.namespace": c.PodNamespace,
				"io.kubernetes.pod.uid": c.PodUID, "io.kubernetes.container.name": c.Name,
			},
		})
	}
	return out, nil
}

// ContainerStatus reports one container.
func (r *CRI) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no container %s", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
		Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt}, State: c.State,
		ExitCode: c.ExitCode, StartedAt: c.StartedAt, FinishedAt: c.FinishedAt,
	}}, nil
}

// StopContainer records the call and marks the container exited.
func (r *CRI) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no container %s", req.GetContainerId())
	}
	c.State, c.ExitCode = runtimeapi.ContainerState_CONTAINER_EXITED, 137
	r.containers[c.ID] = c
	r.stopped = append(r.stopped, c.ID)
	return &runtimeapi.StopContainerResponse{}, nil
}
