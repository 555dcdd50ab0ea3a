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

	"github.com/lifeline-edge/lifeline/test/edgesim"
)

func main() {
	var (
		kubeconfig = flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API server (or of the node's proxy to it)")
		nodeName   = flag.String("node-name", "", "name of the Node to register")
		stateDir   = flag.String("state-dir", "", "directory for the node's pods, logs and pid files")
		imagesFile = flag.String("images", "", `JSON file mapping images (without tag) to commands: {"image": ["/path/bin", "arg"]}`)
		cloud      = flag.Bool("cloud", false, "register a cloud node (no edge labels)")
		criSocket  = flag.String("cri-socket", "", "serve the node's CRI subset (what the edge agent reads) on this unix socket")
		metaServer = flag.String("metaserver-address", "", "serve the node's MetaServer subset (pod list, pods/restart) on this TCP address")
		staticDir  = flag.String("static-pod-dir", "", "edged's manifest directory: the pods in it run without the API server")
		lcServer   = flag.String("lc-server", "", "LC_SERVER given to the node's workers instead of theirs (the node agent's report address)")
		heartbeat  = flag.Duration("heartbeat-interval", 10*time.Second, "how often the node renews its lease and status")
		lease      = flag.Duration("lease-duration", 40*time.Second, "duration of the node's lease")
		backoff    = flag.Duration("crash-backoff", 10*time.Second, "first restart delay of a crashing container")
		maxBackoff = flag.Duration("max-crash-backoff", 5*time.Minute, "longest restart delay")
	)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *stateDir, *imagesFile, *criSocket, *metaServer, *cloud, edgesim.Config{
		HeartbeatInterval: *heartbeat, LeaseDuration: *lease, CrashBackoff: *backoff, MaxCrashBackoff: *maxBackoff, LCServer: *lcServer, StaticPodDir: *staticDir,
	}); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-edgesim:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, stateDir, imagesFile, criSocket, metaServer string, cloud bool, cfg edgesim.Config) error {
	if nodeName == "" || stateDir == "" || imagesFile == "" {
		return fmt.Errorf("--node-name, --state-dir and --images are required")
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(imagesFile)
	if err != nil {
		return fmt.Errorf("reading image map: %w", err)
	}
	if err := json.Unmarshal(data, &cfg.Images); err != nil {
		return fmt.Errorf("decoding image map %s: %w", imagesFile, err)
	}
	cfg.NodeName, cfg.Client, cfg.StateDir = nodeName, client, stateDir
	if cloud {
		cfg.Labels = map[string]string{"node-role.kubernetes.io/cloud": ""}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	node := edgesim.New(cfg)
	if criSocket != "" {
		go func() {
			if err := node.ServeCRI(ctx, criSocket); err != nil {
				fmt.Fprintln(os.Stderr, "lifeline-edgesim:", err)
			}
		}()
	}
	if metaServer != "" {
		l, err := net.Listen("tcp", metaServer)
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
