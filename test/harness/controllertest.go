package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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
	// cache is the running controller's cache, where Passes and Cached read what the controller sees.
	cache client.Reader

	passMu sync.Mutex
	passes map[passKey]int // successful passes, counted by the controllers' ReconcileHook
	pokes  atomic.Int64
}

// passKey names an object one controller passes over.
type passKey struct {
	controller string
	object     client.ObjectKey
}

// Main is a TestMain body: it sets up the Env, hands it to use, and runs the tests.
func Main(m *testing.M, use func(*Env)) int {
	root, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts := ControlPlaneOptions{WithoutScheduler: true, CRDDirs: []string{filepath.Join(root, "deploy", "crds")}, Policies: []string{filepath.Join(root, "deploy", "manifests", "lifeline.yaml")}}
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
	mgr, err := manager.New(e.ControlPlane.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Restartable: true, Clock: e.Clock,
		Instrument: func(m ctrl.Manager) ctrl.Manager { return WithReconciled(m, e.reconciled) }})
	if err != nil {
		return err
	}
	e.cache = mgr.GetCache()
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

// passWithin bounds each wait of Passes: a pass of an idle controller takes milliseconds.
const passWithin = 30 * time.Second

// passAnnotation is the annotation Passes changes on an object to wake its controller: Lifeline's controllers
// pass over a workload at any change of it, and read no annotation of this name.
const passAnnotation = "test.lifeline/pass"

// reconciled counts a pass; it is the ReconcileHook of the controllers the Env runs. A pass that failed
// may have stopped before it would have acted, so only those that succeeded count.
func (e *Env) reconciled(controller string, req reconcile.Request, err error) {
	if err != nil {
		return
	}
	e.passMu.Lock()
	defer e.passMu.Unlock()
	if e.passes == nil {
		e.passes = map[passKey]int{}
	}
	e.passes[passKey{controller, req.NamespacedName}]++
}

func (e *Env) passCount(k passKey) int {
	e.passMu.Lock()
	defer e.passMu.Unlock()
	return e.passes[k]
}

// CountPasses returns mgr, through which the controller a test sets up itself (RunEdgeAware's setup) counts its
// passes for Passes, as the package's controller does; Passes and Cached then read mgr's cache, until the
// package's controller runs again.
func (e *Env) CountPasses(mgr ctrl.Manager) ctrl.Manager {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cache = mgr.GetCache()
	return WithReconciled(mgr, e.reconciled)
}

// Cached reads the object at key as the running controller's cache holds it. A test that is to make the
// controller pass over a change of another object than the one Passes wakes (which Passes waits for itself)
// first waits here until the controller can see that change: the caches of two kinds fill independently.
func (e *Env) Cached(ctx context.Context, key client.ObjectKey, obj client.Object) error {
	e.mu.Lock()
	c := e.cache
	e.mu.Unlock()
	if c == nil {
		return fmt.Errorf("reading %s from the controller's cache: no controller runs", key)
	}
	return c.Get(ctx, key, obj)
}

// Passes makes the controller of obj (the one named after obj's kind, as Lifeline's controllers are) complete n
// successful passes over obj that began after Passes was called, with its cache holding obj as Passes found it,
// and returns once they ended. What a test asserts next, the controller has looked at and left so n times:
// proof, where waiting a while would only hope that it looked.
//
// Each pass is woken by a change of an annotation of obj. On controller-runtime's priority queue a pass queued
// for later over obj (a child's change waits coalesce.Period) is brought forward to it, so none is left waiting.
func (e *Env) Passes(t testing.TB, obj client.Object, n int) {
	t.Helper()
	gvk, err := apiutil.GVKForObject(obj, e.Client.Scheme())
	if err != nil {
		t.Fatalf("making the controller pass over %s: %v", obj.GetName(), err)
	}
	key := passKey{controller: strings.ToLower(gvk.Kind), object: client.ObjectKeyFromObject(obj)}
	what := fmt.Sprintf("a pass of controller %s over %s", key.controller, key.object)
	// Once the cache holds this change of obj, it holds obj at least as it was when Passes was called.
	value := e.poke(t, obj)
	cached := obj.DeepCopyObject().(client.Object)
	testkit.UntilErr(t, passWithin, "the controller's cache to hold "+key.object.String()+" as it is now", func(ctx context.Context) (bool, error) {
		if err := e.Cached(ctx, key.object, cached); err != nil {
			return false, err
		}
		return cached.GetAnnotations()[passAnnotation] == value, nil
	})
	base := e.passCount(key)
	// The first pass to end after base may have begun before it; the passes over one object run one at a time,
	// so every later one began after it.
	for {
		c := e.passCount(key)
		if c-base > n {
			return
		}
		e.poke(t, obj)
		testkit.Until(t, passWithin, what, func() bool { return e.passCount(key) > c })
	}
}

// poke changes obj's pass annotation to a new value, which it returns.
func (e *Env) poke(t testing.TB, obj client.Object) string {
	t.Helper()
	value := strconv.FormatInt(e.pokes.Add(1), 10)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, passAnnotation, value)
	if err := e.Client.Patch(context.Background(), obj.DeepCopyObject().(client.Object), client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatalf("waking the controller of %s: %v", obj.GetName(), err)
	}
	return value
}
