package edgesim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
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
	waitUntil(t, "the static pod's process running", running)
	if err := os.Remove(manifest); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the static pod stopped once its manifest is gone", func() bool { return !running() })
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("%s: not within 10s", what)
}
