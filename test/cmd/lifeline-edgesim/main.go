// Command lifeline-edgesim runs one hollow KubeEdge edge node: see package edgesim.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lifeline-edge/lifeline/test/simnode"
)

// options are the command line's settings.
type options struct {
	kubeconfig, nodeName, stateDir, imagesFile, criSocket, metaServer string
	cloud                                                             bool
	cfg                                                               simnode.Config
}

func parseFlags(args []string) (*options, error) {
	var o options
	fs := flag.NewFlagSet("lifeline-edgesim", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API server (or of the node's proxy to it)")
	fs.StringVar(&o.nodeName, "node-name", "", "name of the Node to register")
	fs.StringVar(&o.stateDir, "state-dir", "", "directory for the node's pods, logs and pid files")
	fs.StringVar(&o.imagesFile, "images", "", `JSON file mapping images (without tag) to commands: {"image": ["/path/bin", "arg"]}`)
	fs.BoolVar(&o.cloud, "cloud", false, "register a cloud node (no edge labels)")
	fs.StringVar(&o.criSocket, "cri-socket", "", "serve the node's CRI subset (what the edge agent reads) on this unix socket")
	fs.StringVar(&o.metaServer, "metaserver-address", simnode.DefaultMetaServerAddress,
		"serve the node's MetaServer subset (pod list and watch, pods/restart) over plain HTTP on this TCP address, as edgecore does; empty: none")
	fs.StringVar(&o.cfg.StaticPodDir, "static-pod-dir", "", "edged's manifest directory: the pods in it run without the API server")
	fs.StringVar(&o.cfg.LCServer, "lc-server", "", "LC_SERVER given to the node's workers instead of theirs (the node agent's report address)")
	fs.DurationVar(&o.cfg.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "how often the node renews its lease and status")
	fs.DurationVar(&o.cfg.LeaseDuration, "lease-duration", 40*time.Second, "duration of the node's lease")
	fs.DurationVar(&o.cfg.CrashBackoff, "crash-backoff", 10*time.Second, "first restart delay of a crashing container")
	fs.DurationVar(&o.cfg.MaxCrashBackoff, "max-crash-backoff", 5*time.Minute, "longest restart delay")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-edgesim:", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	cfg := o.cfg
	if o.nodeName == "" || o.stateDir == "" || o.imagesFile == "" {
		return fmt.Errorf("--node-name, --state-dir and --images are required")
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(o.imagesFile)
	if err != nil {
		return fmt.Errorf("reading image map: %w", err)
	}
	if err := json.Unmarshal(data, &cfg.Images); err != nil {
		return fmt.Errorf("decoding image map %s: %w", o.imagesFile, err)
	}
	cfg.NodeName, cfg.Client, cfg.StateDir = o.nodeName, client, o.stateDir
	if o.cloud {
		cfg.Labels = map[string]string{"node-role.kubernetes.io/cloud": ""}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	node := simnode.New(cfg)
	if o.criSocket != "" {
		go func() {
			if err := node.ServeCRI(ctx, o.criSocket); err != nil {
				fmt.Fprintln(os.Stderr, "lifeline-edgesim:", err)
			}
		}()
	}
	if o.metaServer != "" {
		l, err := net.Listen("tcp", o.metaServer)
		if err != nil {
			return fmt.Errorf("listening for the MetaServer subset: %w", err)
		}
		go func() {
			if err := node.ServeMetaServer(ctx, l); err != nil {
				fmt.Fprintln(os.Stderr, "lifeline-edgesim:", err)
			}
		}()
	}
	return node.Run(ctx)
}
