package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// Binaries sim launches besides the control plane's; `make build-sim` puts them into bin/.
const (
	ControllerBinary   = "lifeline-controller"
	AgentBinary        = "lifeline-agent"
	EdgesimBinary      = "lifeline-edgesim"
	SampleWorkerBinary = "lifeline-sampleworker"
)

// Cluster is the simulation's name in the MQTT topic tree.
const Cluster = "sim"

// SimOptions configure a simulation.
type SimOptions struct {
	// CloudNodes and EdgeNodes are the hollow nodes to run; defaults: "cloud"; "edge1", "edge2", "edge3".
	CloudNodes, EdgeNodes []string
	// CrashBackoff is the nodes' first restart delay of a crashing container (default 1 s, to keep demos short).
	CrashBackoff time.Duration
	// Cluster configures the control plane; its CRDDirs default to this repository's deploy/crds, its
	// Policies then to the chart's, from deploy/manifests.
	Cluster ControlPlaneOptions
	// Progress receives a line per step; nil means os.Stderr.
	Progress io.Writer
	// AgentMemoryLimit and ControllerMemoryLimit, when set, hold each agent and the controller in a memory
	// cgroup of that many bytes, as the chart's limits hold them in their containers (where the machine offers
	// no memory cgroup, the run says so and goes on without); MemoryUse tells how they fared.
	AgentMemoryLimit, ControllerMemoryLimit int64
}

// Sim is a running simulation.
type Sim struct {
	ControlPlane *ControlPlane
	Kube         kubernetes.Interface
	Client       client.Client

	opts       SimOptions
	imagesFile string
	nodes      map[string]*Process
	controller *Process
	// mqttAddr is the controller's embedded broker, TLS with brokerCert and brokerKey (signed by the control
	// plane's CA), as the chart's; credentialsDir holds a password file per edge node.
	mqttAddr, credentialsDir string
	brokerCert, brokerKey    string
	metricsAddr              string
	edges                    map[string]*edgeNode
	memcgs                   map[string]*memoryCgroup // by daemon: "controller", "agent-<node>"
}

// edgeNode is what an edge node has besides its hollow kubelet: its links to the cloud (a proxy to the API
// server, one to the broker) and its agent.
type edgeNode struct {
	apiProxy, brokerProxy *testkit.Proxy
	kubeconfig            string
	metaServer, report    string // addresses
	agent                 *Process
	// armStandIns: the agent arms its workers' stand-ins ahead (--arm-stand-ins).
	armStandIns bool
	// readMetaServer: the agent reads its workers from the node's MetaServer, as with the chart's
	// agent.edgecore.metaServer set; by default it reads the controller's word and is given no MetaServer, as on a
	// node keadm joined (MetaServer off).
	readMetaServer bool
}

// FixtureVars place the examples (deploy/examples) on the simulation's nodes: a JI edge worker on edge3, FL
// trainers on edge1 and edge2, the cloud workers on the cloud node.
var FixtureVars = map[string]string{"EDGE_NODE": "edge3", "EDGE_NODE_1": "edge1", "EDGE_NODE_2": "edge2",
	"CLOUD_NODE": "cloud", "API_KEY": "demo"}

// SampleImages maps the images of the examples, Lifeline's and upstream Sedna's, to the sample worker's roles.
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

// StartSim brings everything up and waits for every node to be Ready.
func StartSim(ctx context.Context, opts SimOptions) (_ *Sim, err error) {
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
	root, err := testkit.RepoRoot()
	if err != nil {
		return nil, err
	}
	if opts.Cluster.CRDDirs == nil {
		opts.Cluster.CRDDirs = []string{filepath.Join(root, "deploy", "crds")}
		opts.Cluster.Policies = []string{filepath.Join(root, "deploy", "manifests", "lifeline.yaml")}
	}
	opts.Cluster.Progress = opts.Progress
	cp, err := StartControlPlane(ctx, opts.Cluster)
	if err != nil {
		return nil, err
	}
	s := &Sim{ControlPlane: cp, opts: opts, nodes: map[string]*Process{}, edges: map[string]*edgeNode{},
		memcgs: map[string]*memoryCgroup{}}
	defer func() {
		if err != nil {
			cp.KeepDir()
			cp.Stop()
		}
	}()
	for _, b := range []string{ControllerBinary, AgentBinary, EdgesimBinary, SampleWorkerBinary} {
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
	if err := s.writeCredentials(); err != nil {
		return nil, err
	}
	if s.mqttAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if s.metricsAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if err := s.startController(); err != nil {
		return nil, err
	}
	s.progress("lifeline-controller started, its MQTT broker on %s (log %s)", s.mqttAddr, s.controller.LogPath())
	for _, n := range opts.CloudNodes {
		if err := s.StartNode(n, true); err != nil {
			return nil, err
		}
	}
	for _, n := range opts.EdgeNodes {
		if err := s.addEdgeLinks(n); err != nil {
			return nil, err
		}
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

// StaticPodDir is a hollow node's static-pod manifest directory, which its agent writes rebuilt workers into.
func (s *Sim) StaticPodDir(node string) string { return filepath.Join(s.NodeDir(node), "manifests") }

// CRISocket is where a hollow node serves its CRI subset, for the node's agent.
func (s *Sim) CRISocket(node string) string { return filepath.Join(s.NodeDir(node), "cri.sock") }

// StartNode launches (or launches again) the hollow node called name and, on an edge node, its agent.
func (s *Sim) StartNode(name string, cloud bool) error {
	kubeconfig := s.ControlPlane.Kubeconfig
	e := s.edges[name]
	if e != nil {
		kubeconfig = e.kubeconfig
	}
	args := []string{"--kubeconfig=" + kubeconfig, "--node-name=" + name, "--state-dir=" + s.NodeDir(name),
		"--images=" + s.imagesFile, "--crash-backoff=" + s.opts.CrashBackoff.String(), "--heartbeat-interval=5s",
		"--cri-socket=" + s.CRISocket(name)}
	if cloud {
		args = append(args, "--cloud", "--metaserver-address=") // no MetaServer in the cloud, nor on edgecore's port
	}
	if e != nil {
		args = append(args, "--metaserver-address="+e.metaServer, "--lc-server=http://"+e.report, "--static-pod-dir="+s.StaticPodDir(name))
		if err := os.MkdirAll(s.StaticPodDir(name), 0o755); err != nil {
			return err
		}
	}
	p, err := s.ControlPlane.Launch("node-"+name, filepath.Join(s.ControlPlane.BinDir, EdgesimBinary), args, nil)
	if err != nil {
		return err
	}
	s.nodes[name] = p
	if e != nil {
		return s.startAgent(name, e)
	}
	return nil
}

// startAgent launches the node's lifeline-agent configured as on a KubeEdge node keadm joined: its workers from the
// controller's word (or the node's MetaServer, ReadMetaServer), the node's link to the cloud probed through the
// node's API proxy, the broker through the other.
func (s *Sim) startAgent(name string, e *edgeNode) error {
	source := []string{"--pod-source=controller", "--metaserver="}
	if e.readMetaServer {
		source = []string{"--api-server=http://" + e.metaServer, "--metaserver=http://" + e.metaServer}
	}
	args := []string{"--node-name=" + name, "--cluster=" + Cluster, "--broker=ssl://" + e.brokerProxy.Addr(),
		"--ca-file=" + s.ControlPlane.CAFile(), "--cert-file=", "--key-file=",
		"--password-file=" + filepath.Join(s.credentialsDir, name), "--state-dir=" + s.AgentStateDir(name),
		"--cri-socket=" + s.CRISocket(name), source[0], source[1],
		"--cloud-probe=https://" + e.apiProxy.Addr() + "/healthz", "--cloud-probe-ca=" + s.ControlPlane.CAFile(), "--static-pod-dir=" + s.StaticPodDir(name),
		"--report-address=" + e.report, "--metrics-address=", "--health-address=", "--heal-api-grace=2s", "--log-level=debug"}
	if e.readMetaServer {
		// The hollow node's MetaServer speaks plain HTTP, as KubeEdge's does unless requireAuthorization is on: its
		// stand-ins are held to a restricted pod, with node paths below the Models' and Datasets' directories the
		// tests and Sedna's examples use.
		args = append(args, "--allow-insecure-pod-source", "--insecure-pod-source-host-paths="+strings.Join(simDataDirs, ","))
	}
	if e.armStandIns {
		args = append(args, "--arm-stand-ins")
	}
	p, err := s.launchLimited("agent-"+name, filepath.Join(s.ControlPlane.BinDir, AgentBinary), args, s.opts.AgentMemoryLimit)
	if err != nil {
		return err
	}
	e.agent = p
	return nil
}

// simDataDirs are the node directories of the Models, Datasets and outputs that the simulation's tests, Sedna's
// examples and deploy/examples use.
var simDataDirs = []string{"/data", "/models", "/tmp/lifeline-data", "/tmp/lifeline-models", "/joint_inference",
	"/var/lib/helmet-detection", "/var/lib/answer-generation"}

// AgentStateDir is an edge node's agent's state directory: its birth sequence, desired workers and journal.
func (s *Sim) AgentStateDir(node string) string { return filepath.Join(s.NodeDir(node), "agent") }

func (s *Sim) startController() error {
	cp := s.ControlPlane
	var err error
	s.controller, err = s.launchLimited(ControllerBinary, filepath.Join(cp.BinDir, ControllerBinary),
		[]string{"--metrics-bind-address=" + s.metricsAddr, "--health-probe-bind-address=0", "--kubeconfig=" + cp.Kubeconfig,
			"--mqtt-address=" + s.mqttAddr, "--mqtt-tls-cert=" + s.brokerCert, "--mqtt-tls-key=" + s.brokerKey,
			"--mqtt-credentials-dir=" + s.credentialsDir, "--cluster=" + Cluster},
		s.opts.ControllerMemoryLimit)
	return err
}

// launchLimited launches a daemon, in its memory cgroup of limit bytes when limit is set (the same cgroup
// across its restarts, so its counts cover the whole run).
func (s *Sim) launchLimited(name, binary string, args []string, limit int64) (*Process, error) {
	if limit <= 0 {
		return s.ControlPlane.Launch(name, binary, args, nil)
	}
	cg, ok := s.memcgs[name]
	if !ok {
		var err error
		cg, err = newMemoryCgroup("lifeline-sim-"+filepath.Base(s.ControlPlane.Dir)+"-"+name, limit)
		if err != nil {
			s.progress("%s runs without its memory limit: %v", name, err)
			return s.ControlPlane.Launch(name, binary, args, nil)
		}
		s.memcgs[name] = cg
	}
	shell, shellArgs := cg.launcher(binary, args)
	return s.ControlPlane.Launch(name, shell, shellArgs, nil)
}

// MemoryUse is what a daemon held in its memory cgroup took over the run.
type MemoryUse struct {
	PeakBytes int64
	OOMKills  int
}

// MemoryUse tells, for each daemon held in a memory cgroup ("controller", "agent-<node>"), its peak and how
// often the kernel killed it; empty when none is.
func (s *Sim) MemoryUse() (map[string]MemoryUse, error) {
	out := map[string]MemoryUse{}
	for name, cg := range s.memcgs {
		peak, err := cg.PeakBytes()
		if err != nil {
			return nil, fmt.Errorf("%s's peak memory: %w", name, err)
		}
		kills, err := cg.OOMKills()
		if err != nil {
			return nil, fmt.Errorf("%s's OOM kills: %w", name, err)
		}
		out[name] = MemoryUse{PeakBytes: peak, OOMKills: kills}
	}
	return out, nil
}

// RestartController stops lifeline-controller, and with it the embedded broker every agent is connected to, and
// starts it again on the same addresses.
func (s *Sim) RestartController() error {
	s.controller.Stop(10 * time.Second)
	return s.startController()
}

// StopAgent stops an edge node's agent; StartAgent starts it again.
func (s *Sim) StopAgent(node string) {
	if e := s.edges[node]; e != nil && e.agent != nil {
		e.agent.Stop(5 * time.Second)
	}
}

// StartAgent starts an edge node's agent (again), with what its state directory holds.
func (s *Sim) StartAgent(node string) error {
	e := s.edges[node]
	if e == nil {
		return fmt.Errorf("%s is not an edge node", node)
	}
	return s.startAgent(node, e)
}

// ArmStandIns restarts an edge node's agent arming its workers' stand-ins ahead, or no longer.
func (s *Sim) ArmStandIns(node string, on bool) error {
	return s.restartAgentWith(node, func(e *edgeNode) { e.armStandIns = on })
}

// ReadMetaServer restarts an edge node's agent reading its workers from the node's MetaServer (and restarting
// through it), or from the controller's word with no MetaServer, the default.
func (s *Sim) ReadMetaServer(node string, on bool) error {
	return s.restartAgentWith(node, func(e *edgeNode) { e.readMetaServer = on })
}

// restartAgentWith stops an edge node's agent, changes how it is started, and starts it again.
func (s *Sim) restartAgentWith(node string, change func(*edgeNode)) error {
	e := s.edges[node]
	if e == nil {
		return fmt.Errorf("%s is not an edge node", node)
	}
	s.StopAgent(node)
	change(e)
	return s.startAgent(node, e)
}

// AgentExited is nil while an edge node's agent runs, and says how it ended once it has.
func (s *Sim) AgentExited(node string) error {
	if e := s.edges[node]; e != nil && e.agent != nil {
		return e.agent.Exited()
	}
	return fmt.Errorf("%s has no agent", node)
}

// ReportURL is the base URL of an edge node's agent's report API (the workers' LC_SERVER).
func (s *Sim) ReportURL(node string) string { return "http://" + s.edges[node].report }

// MetaServerURL is the base URL of an edge node's MetaServer.
func (s *Sim) MetaServerURL(node string) string { return "http://" + s.edges[node].metaServer }

// StopNode stops a hollow node and its agent as a power cut would: the containers die with them.
func (s *Sim) StopNode(name string) {
	s.StopAgent(name)
	if p := s.nodes[name]; p != nil {
		p.Stop(5 * time.Second)
	}
}

// MQTTAddress is the controller's embedded broker, TLS (BrokerTLS).
func (s *Sim) MQTTAddress() string { return s.mqttAddr }

// BrokerTLS is a client's TLS configuration for the broker: its certificate checked against the control plane's CA.
func (s *Sim) BrokerTLS() *tls.Config {
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(s.ControlPlane.CAFile()); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// MQTTPassword is an edge node's MQTT password.
func (s *Sim) MQTTPassword(node string) (string, error) {
	data, err := os.ReadFile(filepath.Join(s.credentialsDir, node))
	return string(data), err
}

// ControllerMetric sums the samples of a Prometheus counter of the controller whose labels contain match
// (e.g. `reason="forged"`; empty matches all).
func (s *Sim) ControllerMetric(name, match string) (float64, error) {
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if match != "" && !strings.Contains(line, match) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, nil
}

// LosePod makes an edge node lose a pod (processes and local state) without the API server knowing, as an
// eviction would.
func (s *Sim) LosePod(node, namespace, pod string) error {
	return s.postToNode(node, "/debug/lose/"+namespace+"/"+pod, nil)
}

// RestampExit makes an edge node's runtime stamp the exited containers of a pod with a new finish time, as a
// runtime that re-stamps an exited container on every stop does (edgemark's fake one); the node's back-off is
// unchanged.
func (s *Sim) RestampExit(node, namespace, pod string) error {
	return s.postToNode(node, "/debug/restamp/"+namespace+"/"+pod, nil)
}

// ImitateEdgehubReconnect makes an edge node imitate edgehub's reconnect cycle: once cut off, it hears and tells
// the cloud again only at its first attempt, every retryCycle, after the link returns (0 turns it off).
func (s *Sim) ImitateEdgehubReconnect(node string, retryCycle time.Duration) error {
	return s.postToNode(node, fmt.Sprintf("/debug/edgehub-reconnect?retryCycle=%s", retryCycle), nil)
}

// ImitateEdgehub makes an edge node imitate edgehub's late notice of a cut (noticeAfter) and the wait a static
// pod's mirror-pod request makes meanwhile (mirrorPodTimeout; 0 turns the imitation off).
func (s *Sim) ImitateEdgehub(node string, noticeAfter, mirrorPodTimeout time.Duration) error {
	return s.postToNode(node, fmt.Sprintf("/debug/edgehub?noticeAfter=%s&mirrorPodTimeout=%s", noticeAfter, mirrorPodTimeout), nil)
}

// postToNode posts to an edge node's MetaServer address.
func (s *Sim) postToNode(node, path string, body []byte) error {
	e := s.edges[node]
	if e == nil {
		return fmt.Errorf("%s is not an edge node", node)
	}
	resp, err := http.Post("http://"+e.metaServer+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s on %s: %s", path, node, resp.Status)
	}
	return nil
}

// CutAPI cuts the node's link to the API server (the hollow node's and its agent's); RestoreAPI mends it.
func (s *Sim) CutAPI(node string) { s.edges[node].apiProxy.Cut() }

// RestoreAPI mends the node's link to the API server.
func (s *Sim) RestoreAPI(node string) { s.edges[node].apiProxy.Restore() }

// CutBroker cuts the agent's link to the MQTT broker; RestoreBroker mends it.
func (s *Sim) CutBroker(node string) { s.edges[node].brokerProxy.Cut() }

// RestoreBroker mends the agent's link to the MQTT broker.
func (s *Sim) RestoreBroker(node string) { s.edges[node].brokerProxy.Restore() }

// addEdgeLinks gives an edge node its proxies, its kubeconfig through the API proxy, and its addresses.
func (s *Sim) addEdgeLinks(name string) error {
	api, err := testkit.Start(strings.TrimPrefix(s.ControlPlane.APIServerURL, "https://"))
	if err != nil {
		return err
	}
	broker, err := testkit.Start(s.mqttAddr)
	if err != nil {
		return err
	}
	e := &edgeNode{apiProxy: api, brokerProxy: broker, kubeconfig: filepath.Join(s.NodeDir(name), "kubeconfig")}
	if e.metaServer, err = freeAddr(); err != nil {
		return err
	}
	if e.report, err = freeAddr(); err != nil {
		return err
	}
	if err := os.MkdirAll(s.NodeDir(name), 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(s.ControlPlane.Kubeconfig)
	if err != nil {
		return err
	}
	through := strings.ReplaceAll(string(data), s.ControlPlane.APIServerURL, "https://"+api.Addr())
	if err := os.WriteFile(e.kubeconfig, []byte(through), 0o600); err != nil {
		return err
	}
	s.edges[name] = e
	return nil
}

// writeCredentials gives every edge node an MQTT password, as the controller's mounted Secret would.
func (s *Sim) writeCredentials() error {
	var err error
	if s.brokerCert, s.brokerKey, err = s.ControlPlane.ServingCert("lifeline-broker"); err != nil {
		return fmt.Errorf("the broker's certificate: %w", err)
	}
	s.credentialsDir = filepath.Join(s.ControlPlane.Dir, "mqtt-credentials")
	if err := os.MkdirAll(s.credentialsDir, 0o700); err != nil {
		return err
	}
	for _, n := range s.opts.EdgeNodes {
		secret := make([]byte, 16)
		if _, err := rand.Read(secret); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(s.credentialsDir, n), []byte(hex.EncodeToString(secret)), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr() (string, error) { return FreeLoopbackAddr() }

// RestartNode stops and starts a hollow node; its pods come back from its disk state.
func (s *Sim) RestartNode(name string) error {
	s.StopNode(name)
	return s.StartNode(name, contains(s.opts.CloudNodes, name))
}

// KillWorker kills the process of a container with SIGKILL, as an out-of-memory kill would, and returns once it
// is gone.
func (s *Sim) KillWorker(node, namespace, pod, container string) error {
	return s.signalWorker(node, namespace, pod, container, syscall.SIGKILL)
}

// EndWorker makes the process of a sample worker's container exit 0 (SIGUSR1), as a worker that finished
// would, and returns once it is gone.
func (s *Sim) EndWorker(node, namespace, pod, container string) error {
	return s.signalWorker(node, namespace, pod, container, syscall.SIGUSR1)
}

func (s *Sim) signalWorker(node, namespace, pod, container string, sig syscall.Signal) error {
	data, err := os.ReadFile(simnode.PIDFile(s.NodeDir(node), namespace, pod, container))
	if err != nil {
		return fmt.Errorf("finding the process of %s/%s: %w", pod, container, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	// Returns once the process is gone, so what follows sees the worker dead, not the dying process.
	err = wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 5*time.Second, true,
		func(context.Context) (bool, error) { return !simnode.PIDRuns(pid), nil })
	if err != nil {
		return fmt.Errorf("process %d of %s/%s still runs 5 s after %v", pid, pod, container, sig)
	}
	return nil
}

// WorkerRunning tells whether the process of a container runs its command, by its pid file: an armed stand-in's
// container waiting at its gate runs no worker.
func (s *Sim) WorkerRunning(node, namespace, pod, container string) bool {
	pid, ok := simnode.ProcessOf(simnode.PIDFile(s.NodeDir(node), namespace, pod, container))
	return ok && !testkit.AtGate(pid)
}

// StandInRunning tells whether the container of one of the stand-ins of a worker's pod runs its command on the
// node (the agent arms them in two slots in turn), not its gate.
func (s *Sim) StandInRunning(node, namespace, pod, container string) bool {
	for _, name := range lifelinev1.StandInPodsOn(pod, node) {
		if s.WorkerRunning(node, namespace, name, container) {
			return true
		}
	}
	return false
}

// StandInArmed tells whether the container of one of the stand-ins of a worker's pod runs its gate on the node: the
// stand-in is armed, and a rebuild only has to open it.
func (s *Sim) StandInArmed(node, namespace, pod, container string) bool {
	for _, name := range lifelinev1.StandInPodsOn(pod, node) {
		pid, ok := simnode.ProcessOf(simnode.PIDFile(s.NodeDir(node), namespace, name, container))
		if ok && testkit.AtGate(pid) {
			return true
		}
	}
	return false
}

// Kubectl runs the pinned kubectl against the simulation.
func (s *Sim) Kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.ControlPlane.BinDir, KubectlBinary),
		append([]string{"--kubeconfig", s.ControlPlane.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Stop ends every process, closes the proxies, and removes the directory unless it is kept.
func (s *Sim) Stop() {
	s.ControlPlane.Stop()
	for _, e := range s.edges {
		e.apiProxy.Close()
		e.brokerProxy.Close()
	}
	for _, cg := range s.memcgs {
		cg.remove()
	}
}

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
