package desired

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var controlPlane *harness.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(harness.RunTests(m, harness.ControlPlaneOptions{WithoutControllerManager: true, WithoutScheduler: true},
		func(cp *harness.ControlPlane) error { controlPlane = cp; return nil }))
}

func names(ws []Worker) string {
	out := ""
	for _, w := range ws {
		out += w.Namespace + "/" + w.Name + "(" + w.OfflinePolicy + ") "
	}
	return out
}

// An agent restarted while its link to the API server is cut still knows its workers, from disk, and says the
// API server is unreachable; once the link is back it catches up with what changed meanwhile.
func TestWorkersSurviveARestartWhileCutOff(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(controlPlane.Config)
	ns := "desired-test"
	makeNamespace(t, admin, ns)
	pod := func(name, node string, role bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{},
			Annotations: map[string]string{contract.OfflinePolicyAnnotation: "Restart"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "w"}}}}
		if role {
			p.Labels[contract.RoleLabel] = "trainer"
		}
		got, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	worker := pod("trainer-0", "edge-7", true)
	pod("not-a-worker", "edge-7", false)
	pod("elsewhere", "edge-8", true)

	link, err := testkit.Start(controlPlane.APIServerURL[len("https://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	// The admin kubeconfig, with its server replaced by the link's end.
	data, err := os.ReadFile(controlPlane.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	through := strings.ReplaceAll(string(data), controlPlane.APIServerURL, "https://"+link.Addr())
	if err := os.WriteFile(kubeconfig, []byte(through), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := PodClientFromKubeconfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()

	run := func() (*Watcher, context.CancelFunc) {
		w, err := New(client, "edge-7", stateDir, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go w.Run(ctx, 100*time.Millisecond)
		return w, cancel
	}
	w, stop := run()
	testkit.Until(t, waitLimit, "the worker seen and the API server reachable", func() bool {
		return w.Reachable() && names(w.Workers()) == ns+"/trainer-0(Restart) "
	})
	if !w.Has(string(worker.UID)) {
		t.Errorf("Has(%s) = false", worker.UID)
	}

	link.Cut()
	testkit.Until(t, waitLimit, "the API server unreachable", func() bool { return !w.Reachable() })
	stop()

	// The agent restarts while still cut off.
	w, stop = run()
	defer stop()
	if got := names(w.Workers()); got != ns+"/trainer-0(Restart) " {
		t.Fatalf("after a restart while cut off the agent knows %q", got)
	}
	testkit.Until(t, waitLimit, "the restarted agent's first list through the cut link ended", w.Answered)
	if w.Reachable() {
		t.Error("reachable through a cut link")
	}

	// Meanwhile the worker is deleted and another one bound; the agent catches up when the link returns.
	if err := admin.CoreV1().Pods(ns).Delete(ctx, "trainer-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	pod("trainer-1", "edge-7", true)
	link.Restore()
	testkit.Until(t, waitLimit, "the catch-up after the link returned", func() bool {
		return w.Reachable() && names(w.Workers()) == ns+"/trainer-1(Restart) "
	})
}

// waitLimit bounds every wait of these tests.
const waitLimit = 20 * time.Second

// makeNamespace makes namespace ns with the service account its pods need: no kube-controller-manager here makes
// it.
func makeNamespace(t *testing.T, admin kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
