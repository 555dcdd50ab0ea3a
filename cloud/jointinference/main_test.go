package jointinference_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/cluster"
	"github.com/lifeline-edge/lifeline/test/fakekubelet"
)

// Nodes the fixtures name (after placeholder substitution), served by a fake kubelet.
var fixtureNodes = []string{"edge-node", "cloud-node", "edge1i70kbjod", "worker-01"}

var (
	controlPlane *cluster.ControlPlane
	kube         kubernetes.Interface
	k8s          client.Client
	kubelet      *fakekubelet.Kubelet
)

func TestMain(m *testing.M) {
	root, err := cluster.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := cluster.Options{WithoutScheduler: true, CRDDirs: []string{filepath.Join(root, "deploy", "crds")}}
	os.Exit(cluster.RunTests(m, opts, func(cp *cluster.ControlPlane) error {
		controlPlane = cp
		var err error
		if kube, err = kubernetes.NewForConfig(cp.Config); err != nil {
			return err
		}
		scheme, err := manager.Scheme()
		if err != nil {
			return err
		}
		if k8s, err = client.New(cp.Config, client.Options{Scheme: scheme}); err != nil {
			return err
		}
		if kubelet, err = fakekubelet.Start(context.Background(), kube,
			map[string]string{"node-role.kubernetes.io/edge": ""}, fixtureNodes...); err != nil {
			return err
		}
		// The controller logs beside the control plane's, where a failed run keeps them.
		logFile, err := os.Create(filepath.Join(cp.Dir, "lifeline-controller.log"))
		if err != nil {
			return err
		}
		log.SetLogger(zap.New(zap.WriteTo(logFile), zap.UseDevMode(true)))
		return startController()
	}))
}

var (
	controllerMu   sync.Mutex
	stopController func()
)

// startController runs Lifeline's manager in this process, as the binary wires it.
func startController() error {
	controllerMu.Lock()
	defer controllerMu.Unlock()
	mgr, err := manager.New(controlPlane.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Restartable: true})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stopController = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				fmt.Fprintf(os.Stderr, "controller stopped with %v\n", err)
			}
		})
	}
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return fmt.Errorf("controller cache did not sync")
	}
	return nil
}

// withControllerStopped runs fn while no controller runs, then starts it again.
func withControllerStopped(t *testing.T, fn func()) {
	t.Helper()
	controllerMu.Lock()
	stopController()
	controllerMu.Unlock()
	fn()
	if err := startController(); err != nil {
		t.Fatalf("restarting the controller: %v", err)
	}
}

// eventually polls cond every 100 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true,
		func(ctx context.Context) (bool, error) {
			ok, err := cond(ctx)
			if err != nil {
				last = err
				return false, nil
			}
			return ok, nil
		})
	if err != nil {
		t.Fatalf("waiting %v for %s: %v (last error: %v)", timeout, what, err, last)
	}
}
