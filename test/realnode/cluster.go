// Package realnode runs a Kubernetes cluster of real nodes on this machine, without Docker or kind: the control
// plane of test/harness, and per node a kubelet, kube-proxy and a containerd of its own (Debian's containerd, runc
// and CNI plugins), each node in its own network and mount namespaces. Images come from archives imported into
// every node's containerd, as there is no registry. It needs root.
package realnode

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/test/harness"
)

// NodeSpec names a node, its role and what runs its pods (DaemonKubelet when empty).
type NodeSpec struct {
	Name   string
	Role   Role
	Daemon Daemon
}

// DefaultNodes are one cloud node and two edge nodes.
var DefaultNodes = []NodeSpec{{Name: "cloud-1", Role: RoleCloud}, {Name: "edge-1", Role: RoleEdge}, {Name: "edge-2", Role: RoleEdge}}

// WithDaemon is specs with every node of role run by daemon.
func WithDaemon(specs []NodeSpec, role Role, daemon Daemon) []NodeSpec {
	out := slices.Clone(specs)
	for i := range out {
		if out[i].Role == role {
			out[i].Daemon = daemon
		}
	}
	return out
}

// Options configure a cluster of real nodes.
type Options struct {
	// Dir holds everything: the control plane's files and logs, and every node's disk. It must exist or be
	// creatable, and be short: containerd's socket path within it is limited to 107 bytes.
	Dir string
	// Nodes are the nodes; empty means DefaultNodes.
	Nodes []NodeSpec
	// Images are imported into every node's containerd before its kubelet starts.
	Images []ImageArchive
	// BinDir holds the control plane's binaries, kubelet and kube-proxy; empty as test/harness finds it.
	BinDir string
	// NodeMonitorGracePeriod is kube-controller-manager's; zero keeps its default.
	NodeMonitorGracePeriod time.Duration
	// Progress receives a line per step; nil means os.Stderr.
	Progress io.Writer
}

// Cluster is a running cluster of real nodes.
type Cluster struct {
	// Kubeconfig is the admin kubeconfig.
	Kubeconfig string
	// Nodes are the nodes, in the order of Options.Nodes.
	Nodes []*Node

	cp     *harness.ControlPlane
	dns    *serviceDNS
	client kubernetes.Interface
	// cloudcore runs when a node's daemon is edgecore; joinToken is the token its nodes join with.
	cloudcore *harness.Process
	joinToken string
	binDir    string
	dir       string
	apiPort   int
	progress  func(format string, args ...any)
}

// Requirements are the programs a cluster of real nodes needs on this machine beyond bin/.
var Requirements = []string{"containerd", "runc", "ctr", "ip", "iptables", "nsenter", "unshare", "/usr/lib/cni/bridge"}

// CheckMachine says what this machine lacks for real nodes, or nil.
func CheckMachine() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("real nodes need root")
	}
	for _, r := range Requirements {
		if _, err := exec.LookPath(r); err != nil { // a path with a slash is looked at as it is
			return fmt.Errorf("%s is missing: apt-get install containerd runc containernetworking-plugins iptables", r)
		}
	}
	return nil
}

// Start brings up the control plane and the nodes, imports the images into each node and waits until every
// node is Ready and labelled for its role. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := CheckMachine(); err != nil {
		return nil, err
	}
	began := time.Now()
	out := opts.Progress
	if out == nil {
		out = os.Stderr
	}
	c := &Cluster{dir: opts.Dir, progress: func(format string, args ...any) {
		fmt.Fprintf(out, "real nodes: "+format+" (%.0fs)\n", append(args, time.Since(began).Seconds())...)
	}}
	// A new cluster: nothing of an earlier one in the directory (etcd's data above all) is taken over.
	for _, sub := range []string{"control-plane", "nodes", "run", "ns"} {
		_ = syscall.Unmount(filepath.Join(c.dir, sub), syscall.MNT_DETACH)
		if err := os.RemoveAll(filepath.Join(c.dir, sub)); err != nil {
			return nil, fmt.Errorf("emptying %s: %w", c.dir, err)
		}
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", c.dir, err)
	}
	specs := opts.Nodes
	if len(specs) == 0 {
		specs = DefaultNodes
	}
	for i, s := range specs {
		n := &Node{Name: s.Name, Role: s.Role, Daemon: cmp.Or(s.Daemon, DaemonKubelet), index: i + 1, Disk: filepath.Join(c.dir, "nodes", s.Name),
			runDir: filepath.Join(c.dir, "run", s.Name), mountNS: filepath.Join(c.dir, "ns", s.Name)}
		n.CRISocket = n.onDisk(CRISocketPath)
		c.Nodes = append(c.Nodes, n)
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := setUpHostNetwork(ctx); err != nil {
		return nil, err
	}
	if err := privateDir(ctx, filepath.Join(c.dir, "ns")); err != nil {
		return nil, err
	}
	c.cp, err = harness.StartControlPlane(ctx, harness.ControlPlaneOptions{
		BinDir: opts.BinDir, Dir: filepath.Join(c.dir, "control-plane"), KeepDir: true,
		AdvertiseAddress:       net.ParseIP(apiAddress),
		NodeMonitorGracePeriod: opts.NodeMonitorGracePeriod,
		Progress:               out,
	})
	if err != nil {
		return nil, err
	}
	c.Kubeconfig, c.binDir = c.cp.Kubeconfig, c.cp.BinDir
	if c.apiPort, err = portOf(c.cp.APIServerURL); err != nil {
		return nil, err
	}
	if c.client, err = c.cp.Client(); err != nil {
		return nil, err
	}
	if c.dns, err = startServiceDNS(context.WithoutCancel(ctx), c.client); err != nil {
		return nil, err
	}
	if slices.ContainsFunc(c.Nodes, func(n *Node) bool { return n.Daemon == DaemonEdgecore }) {
		if err := c.startCloudcore(ctx); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.bootNode(ctx, n, opts.Images); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.waitReady(ctx, n); err != nil {
			return nil, err
		}
	}
	c.progress("%d nodes Ready", len(c.Nodes))
	return c, nil
}

// bootNode starts a node's containerd, imports the images, starts its kubelet and kube-proxy, and labels it.
func (c *Cluster) bootNode(ctx context.Context, n *Node, images []ImageArchive) error {
	if err := n.boot(ctx, c); err != nil {
		return err
	}
	for _, img := range images {
		args := []string{"--address", n.CRISocket, "-n", "k8s.io", "images", "import"}
		if img.Repository != "" {
			args = append(args, "--digests", "--base-name", img.Repository)
		}
		if err := run(ctx, "ctr", append(args, img.Path)...); err != nil {
			return fmt.Errorf("importing %s into node %s: %w", filepath.Base(img.Path), n.Name, err)
		}
	}
	c.progress("node %s: containerd up, %d images imported", n.Name, len(images))
	if n.Daemon == DaemonEdgecore {
		return n.startEdgecore(ctx, c)
	}
	return n.startKubelet(c)
}

// waitReady waits until the node is Ready, then labels it for its role as keadm (edge) or kubeadm (cloud) would.
func (c *Cluster) waitReady(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := harness.WaitUntil(ctx, n.kubelet, "node "+n.Name+" Ready", func() error {
		node, err := c.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errNotYet
	})
	if err != nil {
		return err
	}
	for _, p := range n.procs {
		if err := p.Exited(); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	labels := map[string]string{"node-role.kubernetes.io/" + string(n.Role): ""}
	if n.Role == RoleEdge {
		labels["node-role.kubernetes.io/agent"] = ""
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":%s}}`, mustJSON(labels))
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s: %w", n.Name, err)
	}
	c.progress("node %s Ready (%s)", n.Name, n.Role)
	return nil
}

// Node returns the node of that name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Client is an admin client of the cluster.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// ControlPlane is the cluster's control plane.
func (c *Cluster) ControlPlane() *harness.ControlPlane { return c.cp }

// Cut drops the node's packets to what it loses (its kubelet's, its agent's and its pods').
func (c *Cluster) Cut(ctx context.Context, node string, link Link, brokerPort int) error {
	n := c.Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	return n.cut(ctx, link, c.apiPort, brokerPort)
}

// Mend gives the node back every link it lost.
func (c *Cluster) Mend(ctx context.Context, node string) error {
	n := c.Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	return n.mend(ctx)
}

// Reboot power-cycles the node: every process and container of it ends, its /run and network are new, and it
// boots from its disk with the images it already has. A cut stays cut: the node boots into the same broken
// link, before its kubelet starts. It does not wait for Ready: a node cut off cannot say so.
func (c *Cluster) Reboot(ctx context.Context, node string) error {
	n := c.Node(node)
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	n.powerOff(ctx)
	c.progress("node %s powered off", n.Name)
	if err := c.bootNode(ctx, n, nil); err != nil {
		return err
	}
	c.progress("node %s booted", n.Name)
	return nil
}

// Stop ends every node and the control plane and removes the machine's network changes; the directory stays
// (Remove deletes it).
func (c *Cluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		n.powerOff(ctx)
	}
	if c.dns != nil {
		c.dns.close()
	}
	if c.cp != nil {
		c.cp.Stop()
	}
	tearDownHostNetwork(ctx)
	_ = syscall.Unmount(filepath.Join(c.dir, "ns"), syscall.MNT_DETACH)
}

// Remove deletes the cluster's directory; call it after Stop.
func (c *Cluster) Remove() error { return os.RemoveAll(c.dir) }

// privateDir makes dir a private mount, where files can hold mount namespaces (unshare refuses a shared one).
func privateDir(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	_ = syscall.Unmount(dir, syscall.MNT_DETACH) // left by a run that was killed
	if err := run(ctx, "mount", "--bind", dir, dir); err != nil {
		return err
	}
	return run(ctx, "mount", "--make-private", dir)
}

func portOf(rawURL string) (int, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", rawURL, err)
	}
	return strconv.Atoi(u.Port())
}

func mustJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
}
