// Package sim runs the whole system on one machine as real processes: the control plane of test/cluster (with
// kube-controller-manager and kube-scheduler), lifeline-controller, and hollow nodes (lifeline-edgesim) running
// the sample workers. The e2e tests and `make demo` both use it.
package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/cluster"
	"github.com/lifeline-edge/lifeline/test/edgesim"
)

// Binaries sim launches besides the control plane's; `make build-sim` puts them into bin/.
const (
	ControllerBinary   = "lifeline-controller"
	EdgesimBinary      = "lifeline-edgesim"
	SampleWorkerBinary = "lifeline-sampleworker"
)

// Options configure a simulation.
type Options struct {
	// CloudNodes and EdgeNodes are the hollow nodes to run; defaults: "cloud"; "edge1", "edge2", "edge3".
	CloudNodes, EdgeNodes []string
	// CrashBackoff is the nodes' first restart delay of a crashing container (default 1 s, to keep demos short).
	CrashBackoff time.Duration
	// Cluster configures the control plane; its CRDDirs default to this repository's deploy/crds.
	Cluster cluster.Options
	// Progress receives a line per step; nil means os.Stderr.
	Progress io.Writer
}

// Sim is a running simulation.
type Sim struct {
	ControlPlane *cluster.ControlPlane
	Kube         kubernetes.Interface
	Client       client.Client

	opts       Options
	imagesFile string
	nodes      map[string]*cluster.Process
	controller *cluster.Process
}

// FixtureVars place the shared Sedna examples on the simulation's nodes: the JI edge worker on edge3, the cloud
// worker on the cloud node.
var FixtureVars = map[string]string{"EDGE_NODE": "edge3", "CLOUD_NODE": "cloud", "API_KEY": "demo"}

// SampleImages maps the images of the shared Sedna fixtures to the sample worker's roles.
var SampleImages = map[string]string{
	"kubeedge/sedna-example-joint-inference-helmet-detection-big":                    "ji-big",
	"kubeedge/sedna-example-joint-inference-helmet-detection-little":                 "ji-little",
	"kubeedge/sedna-example-joint-inference-answer-generation-big":                   "ji-big",
	"kubeedge/sedna-example-joint-inference-answer-generation-little":                "ji-little",
	"kubeedge/sedna-example-federated-learning-surface-defect-detection-aggregation": "fl-aggregator",
	"kubeedge/sedna-example-federated-learning-surface-defect-detection-train":       "fl-trainer",
	"kubeedge/sedna-example-federated-learning-mistnet-yolo-aggregator":              "fl-aggregator",
	"kubeedge/sedna-example-federated-learning-mistnet-yolo-client":                  "fl-trainer",
}

// Start brings everything up and waits for every node to be Ready.
func Start(ctx context.Context, opts Options) (_ *Sim, err error) {
	if opts.CloudNodes == nil {
		opts.CloudNodes = []string{"cloud"}
	}
	if opts.EdgeNodes == nil {
		opts.EdgeNodes = []string{"edge1", "edge2", "edge3"}
	}
	if opts.CrashBackoff == 0 {
		opts.CrashBackoff = time.Second
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return nil, err
	}
	if opts.Cluster.CRDDirs == nil {
		opts.Cluster.CRDDirs = []string{filepath.Join(root, "deploy", "crds")}
	}
	opts.Cluster.Progress = opts.Progress
	cp, err := cluster.Start(ctx, opts.Cluster)
	if err != nil {
		return nil, err
	}
	s := &Sim{ControlPlane: cp, opts: opts, nodes: map[string]*cluster.Process{}}
	defer func() {
		if err != nil {
			cp.KeepDir()
			cp.Stop()
		}
	}()
	for _, b := range []string{ControllerBinary, EdgesimBinary, SampleWorkerBinary} {
		if _, err := os.Stat(filepath.Join(cp.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run `make build`", b, cp.BinDir)
		}
	}
	if s.Kube, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return nil, err
	}
	scheme, err := manager.Scheme()
	if err != nil {
		return nil, err
	}
	if s.Client, err = client.New(cp.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if err := s.writeImageMap(); err != nil {
		return nil, err
	}
	if s.controller, err = cp.Launch(ControllerBinary, filepath.Join(cp.BinDir, ControllerBinary),
		[]string{"--metrics-bind-address=0", "--health-probe-bind-address=0", "--kubeconfig=" + cp.Kubeconfig}, nil); err != nil {
		return nil, err
	}
	s.progress("lifeline-controller started (log %s)", s.controller.LogPath())
	for _, n := range opts.CloudNodes {
		if err := s.StartNode(n, true); err != nil {
			return nil, err
		}
	}
	for _, n := range opts.EdgeNodes {
		if err := s.StartNode(n, false); err != nil {
			return nil, err
		}
	}
	if err := s.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	s.progress("%d cloud and %d edge hollow nodes Ready", len(opts.CloudNodes), len(opts.EdgeNodes))
	return s, nil
}

func (s *Sim) progress(format string, args ...any) {
	fmt.Fprintf(s.opts.Progress, "sim: "+format+"\n", args...)
}

func (s *Sim) writeImageMap() error {
	worker := filepath.Join(s.ControlPlane.BinDir, SampleWorkerBinary)
	images := map[string][]string{}
	for image, role := range SampleImages {
		images[image] = []string{worker, role}
	}
	data, err := json.MarshalIndent(images, "", "  ")
	if err != nil {
		return err
	}
	s.imagesFile = filepath.Join(s.ControlPlane.Dir, "images.json")
	return os.WriteFile(s.imagesFile, data, 0o644)
}

// NodeDir is the state directory of a hollow node: its pods, container logs and pid files.
func (s *Sim) NodeDir(node string) string { return filepath.Join(s.ControlPlane.Dir, "nodes", node) }

// CRISocket is where a hollow node serves its CRI subset, for the node's agent.
func (s *Sim) CRISocket(node string) string { return filepath.Join(s.NodeDir(node), "cri.sock") }

// StartNode launches (or launches again) the hollow node called name.
func (s *Sim) StartNode(name string, cloud bool) error {
	args := []string{"--kubeconfig=" + s.ControlPlane.Kubeconfig, "--node-name=" + name, "--state-dir=" + s.NodeDir(name),
		"--images=" + s.imagesFile, "--crash-backoff=" + s.opts.CrashBackoff.String(), "--heartbeat-interval=5s",
		"--cri-socket=" + s.CRISocket(name)}
	if cloud {
		args = append(args, "--cloud")
	}
	p, err := s.ControlPlane.Launch("node-"+name, filepath.Join(s.ControlPlane.BinDir, EdgesimBinary), args, nil)
	if err != nil {
		return err
	}
	s.nodes[name] = p
	return nil
}

// StopNode stops a hollow node as a power cut would stop edgecore: its containers die with it.
func (s *Sim) StopNode(name string) {
	if p := s.nodes[name]; p != nil {
		p.Stop(5 * time.Second)
	}
}

// RestartNode stops and starts a hollow node; its pods come back from its disk state.
func (s *Sim) RestartNode(name string) error {
	s.StopNode(name)
	return s.StartNode(name, contains(s.opts.CloudNodes, name))
}

// KillWorker kills the process of a container with SIGKILL, as an out-of-memory kill would.
func (s *Sim) KillWorker(node, namespace, pod, container string) error {
	data, err := os.ReadFile(edgesim.PIDFile(s.NodeDir(node), namespace, pod, container))
	if err != nil {
		return fmt.Errorf("finding the process of %s/%s: %w", pod, container, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// WorkerRunning tells whether the process of a container runs, by its pid file.
func (s *Sim) WorkerRunning(node, namespace, pod, container string) bool {
	data, err := os.ReadFile(edgesim.PIDFile(s.NodeDir(node), namespace, pod, container))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return err == nil && syscall.Kill(pid, 0) == nil && !isZombie(pid)
}

func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(data))
	return len(fields) > 2 && fields[2] == "Z"
}

// Kubectl runs the pinned kubectl against the simulation.
func (s *Sim) Kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.ControlPlane.BinDir, cluster.KubectlBinary),
		append([]string{"--kubeconfig", s.ControlPlane.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Stop ends every process and removes the directory unless it is kept.
func (s *Sim) Stop() { s.ControlPlane.Stop() }

func (s *Sim) waitNodesReady(ctx context.Context) error {
	want := len(s.opts.CloudNodes) + len(s.opts.EdgeNodes)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, err := s.Kubectl("get", "nodes", "--no-headers")
		if err == nil && strings.Count(out, " Ready ") == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the hollow nodes did not become Ready within a minute")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
