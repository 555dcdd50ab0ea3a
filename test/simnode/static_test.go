package simnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// A manifest in the static-pod directory runs as a pod named after the node, with no API server; removing the
// manifest stops it.
func TestStaticPodManifestsRunWithoutTheAPIServer(t *testing.T) {
	dir, manifests := t.TempDir(), t.TempDir()
	n := New(Config{NodeName: "edge-1", Client: fake.NewClientset(), StateDir: dir, StaticPodDir: manifests,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, SyncInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan struct{})
	go func() { _ = n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped }) // before the state directory is removed: the node writes into it
	manifest := filepath.Join(manifests, "trainer.yaml")
	if err := os.WriteFile(manifest, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer\n  namespace: fl\n"+
		"spec:\n  containers:\n  - name: main\n    image: sleeper:v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	running := func() bool { return ProcessRuns(PIDFile(dir, "fl", "trainer-edge-1", "main")) }
	testkit.Until(t, waitLimit, "the static pod's process running", running)
	if err := os.Remove(manifest); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, waitLimit, "the static pod stopped once its manifest is gone", func() bool { return !running() })
}

// An init container whose image is mapped runs to its end before the pod's containers start (an armed stand-in's
// gate); one whose image is not mapped is skipped.
func TestInitContainersRunToTheirEndBeforeTheContainers(t *testing.T) {
	dir, manifests := t.TempDir(), t.TempDir()
	gate := filepath.Join(t.TempDir(), "open")
	n := New(Config{NodeName: "edge-1", Client: fake.NewClientset(), StateDir: dir, StaticPodDir: manifests, SyncInterval: 20 * time.Millisecond,
		Images: map[string][]string{"sleeper": {"sleep", "60"}, "gate": {"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.02; done`}}})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	if err := os.WriteFile(filepath.Join(manifests, "trainer.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer\n"+
		"spec:\n  initContainers:\n  - name: storage-initializer\n    image: not-mapped\n  - name: gate\n    image: gate\n    args: ["+gate+"]\n"+
		"  containers:\n  - name: main\n    image: sleeper:v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gating := func() bool { return ProcessRuns(PIDFile(dir, "default", "trainer-edge-1", "gate")) }
	running := func() bool { return ProcessRuns(PIDFile(dir, "default", "trainer-edge-1", "main")) }
	testkit.Until(t, waitLimit, "the gate running", gating)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	opened, err := os.Stat(gate)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, waitLimit, "the container running once the gate ended", running)
	// The container's pid file is written as it starts: after the gate opened, not before.
	if started, err := os.Stat(PIDFile(dir, "default", "trainer-edge-1", "main")); err != nil || started.ModTime().Before(opened.ModTime()) {
		t.Errorf("the container started at %v, before its gate opened at %v (%v)", started.ModTime(), opened.ModTime(), err)
	}
}

// A manifest of a static pod the node ended is not run again until the node purged its UID, as a kubelet does;
// the same pod under another manifest (another UID) runs at once. The node's passes are made by the test.
func TestAStaticPodOfAnEndedUIDDoesNotRunAgainAtOnce(t *testing.T) {
	dir, manifests := t.TempDir(), t.TempDir()
	for _, d := range []string{"pods", "logs", "pids"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n := New(Config{NodeName: "edge-1", Client: fake.NewClientset(), StateDir: dir, StaticPodDir: manifests,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}})
	ctx := context.Background()
	t.Cleanup(n.stopAll)
	manifest := filepath.Join(manifests, "trainer.yaml")
	pod := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer\n  annotations: {written: \"%d\"}\nspec:\n  containers:\n  - name: main\n    image: sleeper:v1\n"
	running := func() bool { return ProcessRuns(PIDFile(dir, "default", "trainer-edge-1", "main")) }
	pass := func(stamp int) {
		t.Helper()
		if stamp == 0 {
			if err := os.Remove(manifest); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(manifest, fmt.Appendf(nil, pod, stamp), 0o600); err != nil {
			t.Fatal(err)
		}
		n.syncStaticPods()
		n.syncAll(ctx)
	}
	pass(1)
	testkit.Until(t, waitLimit, "the static pod running", running)
	pass(0)
	testkit.Until(t, waitLimit, "the static pod stopped", func() bool { return !running() })
	pass(1)
	if len(n.runtimesWhere(nil)) != 0 || running() {
		t.Fatal("a static pod of a UID the node ended ran again at once")
	}
	pass(2)
	testkit.Until(t, waitLimit, "the same pod under a new UID running", running)
}

// waitLimit bounds every wait of these tests.
const waitLimit = 10 * time.Second

// A pod is Ready when its containers are and each of its readiness gates' conditions is true, as a kubelet has it:
// an armed stand-in's gate, a condition no one sets, keeps it from Ready though its containers run.
func TestReadinessGatesHoldAPodFromReady(t *testing.T) {
	gated := &corev1.Pod{Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/gate"}}}}
	opened := gated.DeepCopy()
	opened.Status.Conditions = []corev1.PodCondition{{Type: "example.com/gate", Status: corev1.ConditionTrue}}
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		containers corev1.ConditionStatus
		want       corev1.ConditionStatus
	}{
		{"no gate", &corev1.Pod{}, corev1.ConditionTrue, corev1.ConditionTrue},
		{"a gate no one set", gated, corev1.ConditionTrue, corev1.ConditionFalse},
		{"a gate set", opened, corev1.ConditionTrue, corev1.ConditionTrue},
		{"a gate set, containers not ready", opened, corev1.ConditionFalse, corev1.ConditionFalse},
	} {
		if got := podReady(tc.containers, tc.pod); got != tc.want {
			t.Errorf("%s: Ready %s, want %s", tc.name, got, tc.want)
		}
	}
}
