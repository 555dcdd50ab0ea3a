package realnode

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// The machine's addresses for real nodes. Each node i (from 1) has its own network namespace joined to the
// machine by a veth pair: the machine's end is 10.213.i.1, the node's eth0 10.213.i.2, and its pods take
// 10.244.i.0/24 on the node's bridge, routed by the machine. The API server is advertised at 10.213.0.1, an
// address of the machine that every node reaches through its veth, so a node is cut off by a firewall rule in
// its own namespace while the others are not.
const (
	apiAddress   = "10.213.0.1"
	clusterCIDR  = "10.244.0.0/16"
	netnsPrefix  = "lifeline-"
	vethHostPart = "ll%dh"
)

func (n *Node) hostIP() string  { return fmt.Sprintf("10.213.%d.1", n.index) }
func (n *Node) nodeIP() string  { return fmt.Sprintf("10.213.%d.2", n.index) }
func (n *Node) podCIDR() string { return fmt.Sprintf("10.244.%d.0/24", n.index) }
func (n *Node) netns() string   { return netnsPrefix + n.Name }
func (n *Node) vethHost() string {
	return fmt.Sprintf(vethHostPart, n.index)
}

// run runs a command to its end and returns an error quoting its output when it fails.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// inNetns runs a command in the node's network namespace.
func (n *Node) inNetns(ctx context.Context, name string, args ...string) error {
	return run(ctx, "ip", append([]string{"netns", "exec", n.netns(), name}, args...)...)
}

// setUpHostNetwork gives the machine the API server's address and lets it route between the nodes.
func setUpHostNetwork(ctx context.Context) error {
	tearDownHostNetwork(ctx) // left by a run that was killed
	// On loopback: the machine takes packets for any of its addresses from any interface.
	for _, c := range [][]string{
		{"ip", "addr", "add", apiAddress + "/32", "dev", "lo"},
		{"sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
	} {
		if err := run(ctx, c[0], c[1:]...); err != nil {
			return fmt.Errorf("setting up the machine's network: %w", err)
		}
	}
	return nil
}

func tearDownHostNetwork(ctx context.Context) {
	_ = run(ctx, "ip", "addr", "del", apiAddress+"/32", "dev", "lo")
}

// plugIn creates the node's network namespace, its veth pair and its routes; the pods' bridge is the CNI
// plugin's, made when the first pod starts.
func (n *Node) plugIn(ctx context.Context) error {
	n.unplug(ctx) // left by a run that was killed
	nodeEnd := fmt.Sprintf("ll%dn", n.index)
	steps := [][]string{
		{"ip", "netns", "add", n.netns()},
		{"ip", "link", "add", n.vethHost(), "type", "veth", "peer", "name", nodeEnd},
		{"ip", "link", "set", nodeEnd, "netns", n.netns()},
		{"ip", "addr", "add", n.hostIP() + "/24", "dev", n.vethHost()},
		{"ip", "link", "set", n.vethHost(), "up"},
		{"ip", "-n", n.netns(), "link", "set", nodeEnd, "name", "eth0"},
		{"ip", "-n", n.netns(), "addr", "add", n.nodeIP() + "/24", "dev", "eth0"},
		{"ip", "-n", n.netns(), "link", "set", "eth0", "up"},
		{"ip", "-n", n.netns(), "link", "set", "lo", "up"},
		{"ip", "-n", n.netns(), "route", "add", "default", "via", n.hostIP()},
		{"ip", "route", "add", n.podCIDR(), "via", n.nodeIP()},
	}
	for _, s := range steps {
		if err := run(ctx, s[0], s[1:]...); err != nil {
			return fmt.Errorf("plugging in node %s: %w", n.Name, err)
		}
	}
	// The node forwards its pods' packets, as a node with a bridge CNI does.
	if err := n.inNetns(ctx, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		return fmt.Errorf("plugging in node %s: %w", n.Name, err)
	}
	return nil
}

// unplug removes the node's network namespace (and with it its end of the veth pair, its bridge and its
// firewall) and the machine's route to its pods.
func (n *Node) unplug(ctx context.Context) {
	_ = run(ctx, "ip", "route", "del", n.podCIDR())
	_ = run(ctx, "ip", "link", "del", n.vethHost())
	_ = run(ctx, "ip", "netns", "del", n.netns())
}

// Link is what a cut takes from a node.
type Link string

// The links a node can lose.
const (
	// LinkAPI is the API server and cloudcore: the kubelet or edgecore, kube-proxy, the agent and every pod of the
	// node lose them.
	LinkAPI Link = "api"
	// LinkBroker is Lifeline's MQTT broker.
	LinkBroker Link = "broker"
	// LinkAll is everything beyond the node.
	LinkAll Link = "all"
)

// cutChain is the node's own firewall chain, in front of its output and forwarding; mend flushes it.
const cutChain = "LIFELINE-CUT"

// cut drops the node's packets to what it loses, as a broken link would: connections hang, nothing is refused.
// The cut is the network's, so it outlives a reboot of the node (see applyCuts).
func (n *Node) cut(ctx context.Context, link Link, apiPort, brokerPort int) error {
	if err := n.dropLink(ctx, link, apiPort, brokerPort); err != nil {
		return err
	}
	n.cuts = append(n.cuts, link)
	n.brokerPort = brokerPort
	return nil
}

// applyCuts drops again, in a node's new network after a reboot, what its link had lost before.
func (n *Node) applyCuts(ctx context.Context, apiPort int) error {
	for _, link := range n.cuts {
		if err := n.dropLink(ctx, link, apiPort, n.brokerPort); err != nil {
			return err
		}
	}
	return nil
}

// dropLink adds the firewall rules that drop the node's packets to link.
func (n *Node) dropLink(ctx context.Context, link Link, apiPort, brokerPort int) error {
	var rules [][]string
	switch link {
	case LinkAPI: // and cloudcore, an edgecore node's link to it
		rules = [][]string{{"-p", "tcp", "-d", apiAddress, "--dport", fmt.Sprint(apiPort)},
			{"-p", "tcp", "-d", apiAddress, "--dport", fmt.Sprint(cloudhubWebsocketPort)},
			{"-p", "tcp", "-d", apiAddress, "--dport", fmt.Sprint(cloudhubHTTPSPort)}}
	case LinkBroker:
		rules = [][]string{{"-p", "tcp", "--dport", fmt.Sprint(brokerPort)}}
	case LinkAll:
		rules = [][]string{{"-o", "eth0"}}
	default:
		return fmt.Errorf("unknown link %q: api, broker or all", link)
	}
	if err := n.ensureCutChain(ctx); err != nil {
		return err
	}
	for _, r := range rules {
		if err := n.inNetns(ctx, "iptables", append(append([]string{"-w", "-A", cutChain}, r...), "-j", "DROP")...); err != nil {
			return fmt.Errorf("cutting node %s from %s: %w", n.Name, link, err)
		}
	}
	return nil
}

// mend removes every cut of the node.
func (n *Node) mend(ctx context.Context) error {
	if err := n.ensureCutChain(ctx); err != nil {
		return err
	}
	if err := n.inNetns(ctx, "iptables", "-w", "-F", cutChain); err != nil {
		return fmt.Errorf("mending node %s: %w", n.Name, err)
	}
	n.cuts = nil
	return nil
}

func (n *Node) ensureCutChain(ctx context.Context) error {
	if n.inNetns(ctx, "iptables", "-w", "-n", "-L", cutChain) == nil {
		return nil
	}
	if err := n.inNetns(ctx, "iptables", "-w", "-N", cutChain); err != nil {
		return fmt.Errorf("node %s's firewall: %w", n.Name, err)
	}
	for _, hook := range []string{"OUTPUT", "FORWARD"} {
		if err := n.inNetns(ctx, "iptables", "-w", "-I", hook, "1", "-j", cutChain); err != nil {
			return fmt.Errorf("node %s's firewall: %w", n.Name, err)
		}
	}
	return nil
}
