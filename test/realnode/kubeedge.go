package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/lifeline-edge/lifeline/test/harness"
)

// Daemon is what runs a node's pods.
type Daemon string

// The daemons of nodes.
const (
	// DaemonKubelet is Kubernetes' own kubelet, talking to the API server.
	DaemonKubelet Daemon = "kubelet"
	// DaemonEdgecore is KubeEdge's edgecore (edged, metamanager, edgehub), talking to cloudcore, configured as
	// `keadm join` leaves it: KubeEdge's defaults (MetaServer off, no feature gate) but for this machine's needs.
	DaemonEdgecore Daemon = "edgecore"
)

// KubeEdge's ports on the API server's address, as keadm init sets cloudcore up: cloudhub's websocket (mutual TLS),
// its QUIC port (off) and its HTTPS server (certificates for the nodes; the agents' cloud probe).
const (
	cloudhubWebsocketPort = 10000
	cloudhubQUICPort      = 10001
	cloudhubHTTPSPort     = 10002
)

// CheckKubeEdge says why KubeEdge nodes cannot run here, or nil: cloudcore, edgecore and KubeEdge's CRDs are built
// into binDir by `make tools` from KubeEdge's source archive, when it is beside the repository.
func CheckKubeEdge(binDir string) error {
	for _, f := range []string{"cloudcore", "edgecore", "kubeedge-crds"} {
		if _, err := os.Stat(filepath.Join(binDir, f)); err != nil {
			return fmt.Errorf("%s is not in %s: make tools builds it from ../shared/kubeedge/kubeedge-*.tar.xz, which is not there", f, binDir)
		}
	}
	return nil
}

// startCloudcore applies KubeEdge's CRDs and starts cloudcore beside the API server, as keadm init would, and
// keeps the join token it makes.
func (c *Cluster) startCloudcore(ctx context.Context) error {
	if err := CheckKubeEdge(c.binDir); err != nil {
		return err
	}
	kubectl := filepath.Join(c.binDir, "kubectl")
	if err := run(ctx, kubectl, "--kubeconfig", c.Kubeconfig, "create", "namespace", "kubeedge"); err != nil {
		return err
	}
	if err := run(ctx, kubectl, "--kubeconfig", c.Kubeconfig, "apply", "--server-side", "-R", "-f", filepath.Join(c.binDir, "kubeedge-crds")); err != nil {
		return fmt.Errorf("applying KubeEdge's CRDs: %w", err)
	}
	dir := filepath.Join(c.dir, "cloudcore")
	config, err := cloudcoreConfig(ctx, c.binDir, dir, c.Kubeconfig)
	if err != nil {
		return err
	}
	cloudcore, err := c.cp.Launch("cloudcore", filepath.Join(c.binDir, "cloudcore"), []string{"--config", config, "--v=2"}, nil)
	if err != nil {
		return err
	}
	c.cloudcore = cloudcore
	err = harness.WaitUntil(ctx, cloudcore, "cloudcore's join token", func() error {
		secret, err := c.client.CoreV1().Secrets("kubeedge").Get(ctx, "tokensecret", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.joinToken = string(secret.Data["tokendata"]); c.joinToken == "" {
			return errNotYet
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.progress("cloudcore up at %s (websocket %d, https %d)", apiAddress, cloudhubWebsocketPort, cloudhubHTTPSPort)
	return nil
}

// cloudcoreConfig writes cloudcore's configuration into dir: its defaults (`cloudcore --defaultconfig`), listening
// on the API server's address, its certificates and socket in dir, and no module that changes the machine's own
// firewall (iptablesManager, which keadm init runs inside the cluster).
func cloudcoreConfig(ctx context.Context, binDir, dir, kubeconfig string) (string, error) {
	for _, sub := range []string{"ca", "certs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return "", err
		}
	}
	cfg, err := defaultConfig(ctx, filepath.Join(binDir, "cloudcore"))
	if err != nil {
		return "", err
	}
	for path, v := range map[string]any{
		"kubeAPIConfig.kubeConfig":                    kubeconfig,
		"commonConfig.monitorServer.bindAddress":      apiAddress + ":9091",
		"modules.cloudHub.advertiseAddress":           []string{apiAddress},
		"modules.cloudHub.websocket.address":          apiAddress,
		"modules.cloudHub.https.address":              apiAddress,
		"modules.cloudHub.quic.address":               apiAddress,
		"modules.cloudHub.tlsCAFile":                  filepath.Join(dir, "ca", "rootCA.crt"),
		"modules.cloudHub.tlsCAKeyFile":               filepath.Join(dir, "ca", "rootCA.key"),
		"modules.cloudHub.tlsCertFile":                filepath.Join(dir, "certs", "server.crt"),
		"modules.cloudHub.tlsPrivateKeyFile":          filepath.Join(dir, "certs", "server.key"),
		"modules.cloudHub.unixsocket.address":         "unix://" + filepath.Join(dir, "kubeedge.sock"),
		"modules.iptablesManager.enable":              false,
		"modules.cloudStream.tlsTunnelCAFile":         filepath.Join(dir, "ca", "rootCA.crt"),
		"modules.cloudStream.tlsTunnelCertFile":       filepath.Join(dir, "certs", "server.crt"),
		"modules.cloudStream.tlsTunnelPrivateKeyFile": filepath.Join(dir, "certs", "server.key"),
	} {
		if err := setPath(cfg, path, v); err != nil {
			return "", fmt.Errorf("cloudcore's configuration: %w", err)
		}
	}
	return writeYAML(filepath.Join(dir, "cloudcore.yaml"), cfg)
}

// edgecoreConfig writes the node's edgecore configuration where keadm join puts it: edgecore's defaults
// (`edgecore --defaultconfig`, which is what keadm starts from: MetaServer off, no feature gate), cloudcore's
// address and the join token, the node's name and address, and what this machine needs
// (../shared/kubeedge/README.md): a flat cgroup tree, the home-built pause image, the real nodes' eviction and
// image settings.
func (n *Node) edgecoreConfig(ctx context.Context, c *Cluster) error {
	cfg, err := defaultConfig(ctx, filepath.Join(c.binDir, "edgecore"))
	if err != nil {
		return err
	}
	kubelet := "modules.edged.tailoredKubeletConfig."
	for path, v := range map[string]any{
		"modules.edgeHub.httpServer":            fmt.Sprintf("https://%s:%d", apiAddress, cloudhubHTTPSPort),
		"modules.edgeHub.websocket.server":      fmt.Sprintf("%s:%d", apiAddress, cloudhubWebsocketPort),
		"modules.edgeHub.quic.server":           fmt.Sprintf("%s:%d", apiAddress, cloudhubQUICPort),
		"modules.edgeHub.token":                 c.joinToken,
		"modules.edged.hostnameOverride":        n.Name,
		"modules.edged.nodeIP":                  n.nodeIP(),
		"modules.edged.podSandboxImage":         pauseImage,
		kubelet + "cgroupDriver":                "cgroupfs",
		kubelet + "cgroupsPerQOS":               false,
		kubelet + "enforceNodeAllocatable":      []string{},
		kubelet + "failCgroupV1":                false,
		kubelet + "containerRuntimeEndpoint":    "unix://" + CRISocketPath,
		kubelet + "imageServiceEndpoint":        "unix://" + CRISocketPath,
		kubelet + "fileCheckFrequency":          "1s",
		kubelet + "evictionHard":                map[string]string{"memory.available": "50Mi"},
		kubelet + "imageGCHighThresholdPercent": 100,
		kubelet + "clusterDNS":                  []string{apiAddress},
		kubelet + "clusterDomain":               clusterDomain,
	} {
		if err := setPath(cfg, path, v); err != nil {
			return fmt.Errorf("node %s's edgecore configuration: %w", n.Name, err)
		}
	}
	if err := os.MkdirAll(n.onDisk(filepath.Dir(EdgecoreConfigPath)), 0o755); err != nil {
		return err
	}
	_, err = writeYAML(n.onDisk(EdgecoreConfigPath), cfg)
	return err
}

// EdgecoreConfigPath is where keadm join writes edgecore's configuration, as the node sees it.
const EdgecoreConfigPath = "/etc/kubeedge/config/edgecore.yaml"

// pauseImage is the sandbox image every node's containerd has (the home-built pause).
const pauseImage = "registry.k8s.io/pause:3.10"

// startEdgecore starts the node's edgecore in its namespaces. edgecore refuses to start while a kubelet runs on
// the machine (the other nodes' kubelets): the check is off, as ../shared/kubeedge/README.md says.
func (n *Node) startEdgecore(ctx context.Context, c *Cluster) error {
	if err := n.edgecoreConfig(ctx, c); err != nil {
		return err
	}
	var err error
	n.kubelet, err = c.cp.Launch(n.Name+"-edgecore", "nsenter", n.enter(filepath.Join(c.binDir, "edgecore"),
		"--config="+EdgecoreConfigPath), append(os.Environ(), "CHECK_EDGECORE_ENVIRONMENT=false"))
	if err != nil {
		return err
	}
	n.procs = append(n.procs, n.kubelet)
	return nil
}

// defaultConfig is a KubeEdge binary's default configuration, as it prints it.
func defaultConfig(ctx context.Context, binary string) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--defaultconfig").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --defaultconfig: %w", filepath.Base(binary), err)
	}
	// The first lines are comments; YAML takes them as such.
	var cfg map[string]any
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		return nil, fmt.Errorf("%s --defaultconfig: %w", filepath.Base(binary), err)
	}
	return cfg, nil
}

// setPath sets the value at a dotted path of a configuration, making the maps on the way.
func setPath(cfg map[string]any, path string, v any) error {
	keys := strings.Split(path, ".")
	m := cfg
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			if m[k] != nil {
				return errors.New(path + ": " + k + " is not a map")
			}
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return nil
}

func writeYAML(path string, v any) (string, error) {
	data, err := yaml.Marshal(v)
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, data, 0o600)
}

// LoseEdgecorePod makes an edgecore node lose a pod as a node does when its local store loses it: edgecore stops,
// the pod leaves its database (metamanager's store, which edged runs its pods from), and edgecore starts again,
// its containers of that pod then no pod's. The API server still binds the pod to the node, and cloudcore sends
// it again only if it changes.
func (c *Cluster) LoseEdgecorePod(ctx context.Context, node, namespace, pod string) error {
	n := c.Node(node)
	if n == nil || n.Daemon != DaemonEdgecore {
		return fmt.Errorf("%s is not an edgecore node", node)
	}
	n.kubelet.Stop(10 * time.Second)
	n.procs = slices.DeleteFunc(n.procs, func(p *harness.Process) bool { return p == n.kubelet })
	query := fmt.Sprintf("delete from meta where key like '%[1]s/pod/%[2]s' or key like '%[1]s/podpatch/%[2]s'; "+
		"delete from meta_v2 where namespace = '%[1]s' and name = '%[2]s';", namespace, pod)
	if err := run(ctx, "sqlite3", n.onDisk("/var/lib/kubeedge/edgecore.db"), query); err != nil {
		return fmt.Errorf("node %s losing pod %s/%s: %w", node, namespace, pod, err)
	}
	return n.startEdgecore(ctx, c)
}
