package realnode

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeline-edge/lifeline/test/harness"
)

// Role is what a node is for.
type Role string

// The roles of nodes.
const (
	// RoleCloud nodes run the controller and the cloud workers.
	RoleCloud Role = "cloud"
	// RoleEdge nodes are labelled as keadm labels edge nodes and run the agent and the edge workers.
	RoleEdge Role = "edge"
)

// Node is one real node: a kubelet, kube-proxy and a containerd of its own, in the node's own network and mount
// namespaces, so that its host-network pods, its host paths and its containers are its own.
type Node struct {
	// Name is the Node's name.
	Name string
	// Role is what the node is for.
	Role Role
	// Daemon is what runs the node's pods: a kubelet, or edgecore.
	Daemon Daemon
	// Disk is the node's disk: what survives a reboot.
	Disk string
	// CRISocket is the node's containerd socket, as this machine reaches it.
	CRISocket string

	index      int
	runDir     string // the node's /run: emptied by a reboot
	mountNS    string // the file that holds the node's mount namespace
	procs      []*harness.Process
	kubelet    *harness.Process // or edgecore
	cuts       []Link           // what the node's link has lost: a reboot does not mend it
	brokerPort int              // the broker's port when a cut took it
}

// The node's view of the file system: each path is bound from the node's disk (or its /run) in the node's mount
// namespace, so that nodes on one machine share none of them.
var (
	diskPaths = []string{"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/etc/cni/net.d",
		"/etc/kubernetes", "/var/log/pods", "/var/log/containers", "/var/lib/lifeline-agent", "/etc/lifeline", "/data",
		"/etc/kubeedge", "/var/lib/kubeedge"}
	// /run/netns holds the pods' network namespaces, which containerd names there.
	runPaths = []string{"/run/containerd", "/run/netns"}
)

// StaticPodDir is the kubelet's staticPodPath on every node, as kubeadm sets it.
const StaticPodDir = "/etc/kubernetes/manifests"

// CRISocketPath is containerd's socket as the node's own processes see it.
const CRISocketPath = "/run/containerd/containerd.sock"

// OnDisk is where path of the node, as the node sees it, lives on the machine.
func (n *Node) OnDisk(path string) string { return n.onDisk(path) }

// onDisk is where path of the node lives on the machine.
func (n *Node) onDisk(path string) string {
	for _, p := range runPaths {
		if path == p || strings.HasPrefix(path, p+"/") {
			return filepath.Join(n.runDir, path)
		}
	}
	return filepath.Join(n.Disk, path)
}

// podLogsDir is where the kubelet and edged write the logs of their pods' containers, as the node sees it:
// <namespace>_<pod>_<uid>/<container>/<run>.log, each line `<time> <stream> <F|P> <text>` (CRI's format; P is part
// of a line the next one goes on with).
const podLogsDir = "/var/log/pods"

// podLogs is what the pod's containers wrote since a moment (zero: from their start), every run of each in turn,
// read from its node's disk: the API server serves no log of an edgecore node, whose edgeStream keadm leaves off,
// nor of a node cut off from it.
func (c *Cluster) podLogs(p *corev1.Pod, since time.Time) (string, error) {
	n := c.Node(p.Spec.NodeName)
	if n == nil {
		return "", fmt.Errorf("reading the logs of pod %s/%s: no node %q", p.Namespace, p.Name, p.Spec.NodeName)
	}
	files, err := filepath.Glob(filepath.Join(n.onDisk(podLogsDir), p.Namespace+"_"+p.Name+"_"+string(p.UID), "*", "*.log"))
	if err != nil {
		return "", fmt.Errorf("reading the logs of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	slices.SortFunc(files, func(a, b string) int {
		return cmp.Or(strings.Compare(filepath.Dir(a), filepath.Dir(b)), cmp.Compare(logRun(a), logRun(b)))
	})
	var out strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("reading the logs of pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.SplitN(line, " ", 4)
			if len(fields) < 4 {
				continue // the file's last, empty line
			}
			if at, err := time.Parse(time.RFC3339Nano, fields[0]); err == nil && at.Before(since) {
				continue
			}
			out.WriteString(fields[3])
			if fields[2] != "P" {
				out.WriteString("\n")
			}
		}
	}
	return out.String(), nil
}

// logRun is the run of its container a log file of podLogsDir holds: the container's restart count then.
func logRun(file string) int {
	run, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(file), ".log"))
	return run
}

// boot gives the node a fresh /run and mount namespace and starts containerd; the kubelet and kube-proxy start
// once images are in (startKubelet).
func (n *Node) boot(ctx context.Context, c *Cluster) error {
	if err := os.RemoveAll(n.runDir); err != nil {
		return fmt.Errorf("emptying node %s's /run: %w", n.Name, err)
	}
	for _, p := range append(append([]string{}, diskPaths...), runPaths...) {
		if err := os.MkdirAll(n.onDisk(p), 0o755); err != nil {
			return fmt.Errorf("node %s's disk: %w", n.Name, err)
		}
	}
	if err := os.MkdirAll(n.onDisk(StaticPodDir), 0o755); err != nil {
		return fmt.Errorf("node %s's disk: %w", n.Name, err)
	}
	if err := n.plugIn(ctx); err != nil {
		return err
	}
	if err := n.applyCuts(ctx, c.apiPort); err != nil {
		return err
	}
	if err := n.writeConfigs(c); err != nil {
		return err
	}
	if err := n.newMountNamespace(ctx); err != nil {
		return err
	}
	containerd, err := c.cp.Launch(n.Name+"-containerd", "nsenter",
		n.enter("containerd", "--config", filepath.Join(n.Disk, "containerd.toml")), nil)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, containerd)
	return harness.WaitUntil(ctx, containerd, "node "+n.Name+"'s containerd socket", func() error {
		_, err := os.Stat(n.CRISocket)
		return err
	})
}

// startKubelet starts the node's kubelet and kube-proxy, with the credentials a cluster gives its nodes.
func (n *Node) startKubelet(c *Cluster) error {
	server := fmt.Sprintf("https://%s:%d", apiAddress, c.apiPort)
	kubeletKubeconfig, err := c.cp.ClientKubeconfig(server, "system:node:"+n.Name, "system:nodes")
	if err != nil {
		return fmt.Errorf("node %s's credentials: %w", n.Name, err)
	}
	proxyKubeconfig, err := c.cp.ClientKubeconfig(server, "system:kube-proxy")
	if err != nil {
		return fmt.Errorf("kube-proxy's credentials: %w", err)
	}
	n.kubelet, err = c.cp.Launch(n.Name+"-kubelet", "nsenter", n.enter(filepath.Join(c.binDir, "kubelet"),
		"--config="+filepath.Join(n.Disk, "kubelet.yaml"),
		"--kubeconfig="+kubeletKubeconfig,
		"--hostname-override="+n.Name,
		"--node-ip="+n.nodeIP(),
		"--v=1"), append(os.Environ(), KubeletLinkCheck...))
	if err != nil {
		return err
	}
	n.procs = append(n.procs, n.kubelet)
	// With --config, kube-proxy takes its kubeconfig and name from the file only.
	proxyConfig := filepath.Join(n.Disk, "kube-proxy.yaml")
	if err := os.WriteFile(proxyConfig, []byte(fmt.Sprintf(kubeProxyConfig, clusterCIDR, n.Name, proxyKubeconfig)), 0o644); err != nil {
		return fmt.Errorf("node %s's kube-proxy configuration: %w", n.Name, err)
	}
	proxy, err := c.cp.Launch(n.Name+"-kube-proxy", "nsenter", n.enter(filepath.Join(c.binDir, "kube-proxy"),
		"--config="+proxyConfig, "--v=1"), nil)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, proxy)
	return nil
}

// KubeletLinkCheck is the environment docs/operations.md gives the kubelet of an edge node: its client checks
// an idle link to the API server every 2 s and gives it up 2 s after an unanswered ping. Before the kubelet starts
// a static pod (the agent's stand-in for a worker) it creates the pod's mirror pod, and on a link that died
// without a word (packets dropped) that request waits until the link is given up: 45 s with client-go's
// defaults (30 s idle, 15 s ping), about 4 s with these (then a new dial waits out its own 30 s timeout).
var KubeletLinkCheck = []string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS=2", "HTTP2_PING_TIMEOUT_SECONDS=2"}

// enter is nsenter's arguments that run a command in the node's namespaces.
func (n *Node) enter(command string, args ...string) []string {
	return append([]string{"--mount=" + n.mountNS, "--net=/run/netns/" + n.netns(), "--", command}, args...)
}

// newMountNamespace makes a mount namespace for the node, held by a file, where the node's paths are bound.
func (n *Node) newMountNamespace(ctx context.Context) error {
	if err := os.WriteFile(n.mountNS, nil, 0o600); err != nil {
		return fmt.Errorf("node %s's mount namespace: %w", n.Name, err)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, p := range append(append([]string{}, diskPaths...), runPaths...) {
		fmt.Fprintf(&script, "mkdir -p %s && mount --bind %s %s\n", p, n.onDisk(p), p)
	}
	if err := run(ctx, "unshare", "--mount="+n.mountNS, "--propagation", "private", "--", "sh", "-c", script.String()); err != nil {
		return fmt.Errorf("node %s's mount namespace: %w", n.Name, err)
	}
	return nil
}

// powerOff ends every process of the node, its containers' included, and drops its namespaces: what a power
// cut leaves is the disk.
func (n *Node) powerOff(ctx context.Context) {
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].Stop(5 * time.Second)
	}
	n.procs = nil
	n.killRemaining()
	if n.mountNS != "" {
		_ = syscall.Unmount(n.mountNS, syscall.MNT_DETACH)
		_ = os.Remove(n.mountNS)
	}
	n.unplug(ctx)
}

// killRemaining kills what outlives containerd: its shims, found by the node's mount namespace, and every process
// under them, the containers' (which have mount namespaces of their own, and would outlive the shims as orphans).
func (n *Node) killRemaining() {
	var nsInode uint64
	if fi, err := os.Stat(n.mountNS); err == nil {
		nsInode = fi.Sys().(*syscall.Stat_t).Ino
	}
	if nsInode == 0 {
		return
	}
	// Those killed may have forked meanwhile: again, until none is left, for a second at most.
	_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		killed := 0
		for _, pid := range processesAndDescendants(nsInode) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		return killed == 0, nil
	})
}

// processesAndDescendants lists the processes in the mount namespace of inode nsInode and all their descendants.
func processesAndDescendants(nsInode uint64) []int {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	var roots []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			// pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
			var state string
			var ppid int
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if _, err := fmt.Sscan(string(stat[i+1:]), &state, &ppid); err == nil {
					children[ppid] = append(children[ppid], pid)
				}
			}
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "mnt"), &st) == nil && st.Ino == nsInode {
			roots = append(roots, pid)
		}
	}
	seen := map[int]bool{}
	for len(roots) > 0 {
		pid := roots[len(roots)-1]
		roots = roots[:len(roots)-1]
		if !seen[pid] {
			seen[pid] = true
			roots = append(roots, children[pid]...)
		}
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	return out
}

// writeConfigs writes containerd's, the CNI's, the kubelet's and kube-proxy's configuration on the node's disk.
func (n *Node) writeConfigs(c *Cluster) error {
	files := map[string]string{
		filepath.Join(n.Disk, "containerd.toml"): containerdConfig,
		filepath.Join(n.Disk, "kubelet.yaml"):    fmt.Sprintf(kubeletConfig, StaticPodDir, CRISocketPath, c.cp.CAFile(), apiAddress, clusterDomain),
	}
	cni, err := json.MarshalIndent(cniConfig(n.podCIDR()), "", "  ")
	if err != nil {
		return err
	}
	files[n.onDisk("/etc/cni/net.d/10-lifeline.conflist")] = string(cni)
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return fmt.Errorf("node %s's configuration: %w", n.Name, err)
		}
	}
	return nil
}

// containerdConfig is Debian's containerd with what this machine needs (shared/real-node settings): the home-built
// pause image, Debian's CNI plugin directory, and oom_score_adj left alone (runc cannot lower it in this guest).
const containerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
`

// kubeletConfig keeps the cgroup tree flat (no systemd; cgroup v1 allowed), serves on the node's own address,
// and lets the API server read logs without a client certificate (the nodes' addresses are this machine's only).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
staticPodPath: %s
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "50Mi"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
resolvConf: /etc/resolv.conf
clusterDNS: [%s]
clusterDomain: %s
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
fileCheckFrequency: 1s
`

const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
clientConnection: {kubeconfig: %s}
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

func cniConfig(podCIDR string) map[string]any {
	return map[string]any{
		"cniVersion": "0.4.0",
		"name":       "lifeline",
		"plugins": []map[string]any{
			{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": podCIDR}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
}

var errNotYet = errors.New("not yet")
