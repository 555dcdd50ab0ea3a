package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// FixtureNodes are the nodes the examples name with testkit.DefaultVars, and those upstream Sedna's name.
var FixtureNodes = []string{"edge-node", "cloud-node", "edge1i70kbjod", "worker-01", "edge1", "edge2", "cloud", "sedna-control-plane"}

// Env is what a test package gets.
type Env struct {
	ControlPlane *ControlPlane
	Kube         kubernetes.Interface
	Client       client.Client
	Kubelet      *simnode.Kubelet
	// Clock is the controller's clock; a test steps it to make a backoff, deadline or TTL fall due.
	Clock *SteppingClock

	mu   sync.Mutex
	stop func()
}

// Main is a TestMain body: it sets up the Env, hands it to use, and runs the tests.
func Main(m *testing.M, use func(*Env)) int {
	root, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts := ControlPlaneOptions{WithoutScheduler: true, CRDDirs: []string{filepath.Join(root, "deploy", "crds")}}
	env := &Env{Clock: &SteppingClock{}}
	return RunTests(m, opts, func(cp *ControlPlane) error {
		env.ControlPlane = cp
		var err error
		if env.Kube, err = kubernetes.NewForConfig(cp.Config); err != nil {
			return err
		}
		scheme, err := manager.Scheme()
		if err != nil {
			return err
		}
		if env.Client, err = client.New(cp.Config, client.Options{Scheme: scheme}); err != nil {
			return err
		}
		if env.Kubelet, err = simnode.StartKubelet(context.Background(), env.Kube,
			map[string]string{"node-role.kubernetes.io/edge": ""}, FixtureNodes...); err != nil {
			return err
		}
		// The controller logs beside the control plane's, where a failed run keeps them.
		logFile, err := os.Create(filepath.Join(cp.Dir, "lifeline-controller.log"))
		if err != nil {
			return err
		}
		log.SetLogger(zap.New(zap.WriteTo(logFile), zap.UseDevMode(true)))
		use(env)
		return env.StartController()
	})
}

// StartController runs Lifeline's manager in this process.
func (e *Env) StartController() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	mgr, err := manager.New(e.ControlPlane.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Restartable: true, Clock: e.Clock})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	e.stop = func() {
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

// StopController stops the manager; StartController runs a new one.
func (e *Env) StopController() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stop()
}

// WithControllerStopped runs fn while no controller runs, then starts a new one.
func (e *Env) WithControllerStopped(t testing.TB, fn func()) {
	t.Helper()
	e.StopController()
	fn()
	if err := e.StartController(); err != nil {
		t.Fatalf("restarting the controller: %v", err)
	}
}

// NewNamespace creates a namespace for one test.
func (e *Env) NewNamespace(t testing.TB, prefix string) string {
	t.Helper()
	ns, err := e.Kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// Eventually polls cond, which reads the API server, every 100 ms until it holds or timeout passes; cond's last
// error is reported.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	testkit.Every(t, 100*time.Millisecond, timeout, what, cond)
}
