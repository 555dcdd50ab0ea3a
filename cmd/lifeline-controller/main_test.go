package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/cmd/internal/logflags"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// One control plane for the package, started without Lifeline's CRDs: the test installs them itself, after the
// controller, as an operator who applies the chart's CRDs late would.
var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	opts := harness.ControlPlaneOptions{WithoutScheduler: true, WithoutControllerManager: true}
	os.Exit(harness.RunTests(m, opts, func(c *harness.ControlPlane) error {
		cp = c
		return nil
	}))
}

// lockedBuffer is a bytes.Buffer the controller's logger writes to while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// roundTripFunc lets the test see the controller's requests to the API server on their way.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// probe is the status code and body of GET url.
func probe(url string) (int, string, error) {
	resp, err := http.Get(url) //nolint:noctx // a test's probe, bounded by the default client's dial
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestControllerStartedBeforeItsCRDsWaitsThenReconciles: started on an API server that does not serve the sedna.io
// kinds, the controller does not exit: it answers /healthz, stays unready, says once what it waits for, and,
// once the CRDs are installed, becomes ready and reconciles a JointInferenceService into its children — all in
// one run, never having exited.
func TestControllerStartedBeforeItsCRDsWaitsThenReconciles(t *testing.T) {
	harness.SkipIfShort(t)
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	logFile, err := os.Create(filepath.Join(cp.Dir, "lifeline-controller.log")) // kept with the control plane's on failure
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	log, err := logflags.Options{Level: "info", Format: "json"}.Logger(io.MultiWriter(logs, logFile))
	if err != nil {
		t.Fatal(err)
	}
	ctrl.SetLogger(log)
	scheme, err := manager.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	probes := "http://" + harness.FreeAddr(t)
	opts := manager.Options{MetricsAddr: "0", HealthAddr: strings.TrimPrefix(probes, "http://"), MQTTAddress: harness.FreeAddr(t),
		MQTTCredentialsDir: t.TempDir(), Cluster: "default"}

	// asked counts the controller's questions about the sedna.io kinds: one at each turn of its wait for the CRDs.
	var asked atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == "/apis/"+v1alpha1.GroupVersion.String() {
				asked.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan error, 1)
	var ns string
	notExited := func(t *testing.T) {
		t.Helper()
		select {
		case err := <-exited:
			t.Fatalf("the controller exited: %v", err)
		default:
		}
	}
	waitingLines := func() int { return strings.Count(logs.String(), `"waiting for CRDs to be established"`) }

	steps := []struct {
		name  string
		do    func(t *testing.T)
		holds func(t *testing.T)
	}{{
		name: "the controller starts before the CRDs",
		do:   func(*testing.T) { go func() { exited <- run(ctx, cfg, opts) }() },
		holds: func(t *testing.T) {
			testkit.UntilErr(t, 30*time.Second, "healthy and unready, waiting for the CRDs", testkit.Why(func() (bool, string) {
				code, _, err := probe(probes + "/healthz")
				if err != nil || code != http.StatusOK {
					return false, fmt.Sprintf("/healthz: %d %v", code, err)
				}
				code, body, err := probe(probes + "/readyz")
				if err != nil || code == http.StatusOK || !strings.Contains(body, "[-]crds failed") {
					return false, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
				}
				return waitingLines() == 1, "the controller's log:\n" + logs.String()
			}))
			for _, kind := range manager.RequiredKinds {
				if !strings.Contains(logs.String(), kind) {
					t.Errorf("the log does not name the missing kind %s:\n%s", kind, logs.String())
				}
			}
			notExited(t)
		},
	}, {
		name: "it keeps waiting through several retries, saying so once",
		do: func(t *testing.T) {
			until := asked.Load() + 2
			testkit.Until(t, 30*time.Second, "two more questions about the sedna.io kinds", func() bool { return asked.Load() >= until })
		},
		holds: func(t *testing.T) {
			notExited(t)
			if code, body, err := probe(probes + "/readyz"); err != nil || code == http.StatusOK {
				t.Errorf("/readyz: %d %q %v, want unready", code, body, err)
			}
			if n := waitingLines(); n != 1 {
				t.Errorf("the wait was logged %d times, want once", n)
			}
		},
	}, {
		name: "the CRDs are installed",
		do: func(t *testing.T) {
			if err := harness.InstallCRDs(ctx, cp.Config, filepath.Join(root, "deploy", "crds")); err != nil {
				t.Fatal(err)
			}
		},
		holds: func(t *testing.T) {
			testkit.UntilErr(t, 60*time.Second, "ready", testkit.Why(func() (bool, string) {
				code, body, err := probe(probes + "/readyz?verbose")
				return err == nil && code == http.StatusOK, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
			}))
			notExited(t)
		},
	}, {
		name: "a JointInferenceService is created",
		do: func(t *testing.T) {
			ns = createNamespace(t, kube)
			createJI(t, kube, ns, "helmet")
		},
		holds: func(t *testing.T) {
			testkit.UntilErr(t, 60*time.Second, "its worker Deployments and Service", testkit.Why(func() (bool, string) {
				deployments, services := &appsv1.DeploymentList{}, &corev1.ServiceList{}
				if err := kube.List(ctx, deployments, client.InNamespace(ns)); err != nil {
					return false, err.Error()
				}
				if err := kube.List(ctx, services, client.InNamespace(ns)); err != nil {
					return false, err.Error()
				}
				return len(ownedBy(deployments.Items, "helmet")) == 2 && len(ownedBy(services.Items, "helmet")) == 1,
					fmt.Sprintf("%d Deployments and %d Services of it", len(ownedBy(deployments.Items, "helmet")),
						len(ownedBy(services.Items, "helmet")))
			}))
			notExited(t)
		},
	}}
	for _, step := range steps {
		t.Logf("step: %s", step.name)
		step.do(t)
		step.holds(t)
	}
	cancel()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the controller stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the controller did not stop within 30 s of its context's end")
	}
}

// ownedBy are the objects whose controller is the JointInferenceService named owner.
func ownedBy[T any, P interface {
	*T
	metav1.Object
}](items []T, owner string) []P {
	var out []P
	for i := range items {
		obj := P(&items[i])
		if ref := metav1.GetControllerOf(obj); ref != nil && ref.Kind == "JointInferenceService" && ref.Name == owner {
			out = append(out, obj)
		}
	}
	return out
}

func createNamespace(t *testing.T, kube client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "late-crds-"}}
	if err := kube.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// createJI creates the helmet-detection example JointInferenceService in ns under name, with its Models.
func createJI(t *testing.T, kube client.Client, ns, name string) {
	t.Helper()
	ji := &v1alpha1.JointInferenceService{}
	if err := testkit.LoadObject("joint-inference.yaml", testkit.DefaultVars, ji); err != nil {
		t.Fatal(err)
	}
	ji.Namespace, ji.Name = ns, name
	for _, m := range []string{ji.Spec.EdgeWorker.Model.Name, ji.Spec.CloudWorker.Model.Name} {
		model := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m}, Spec: v1alpha1.ModelSpec{URL: "/models/" + m, Format: "pb"}}
		if err := kube.Create(context.Background(), model); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	if err := kube.Create(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
}
