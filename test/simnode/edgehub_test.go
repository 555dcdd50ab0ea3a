package simnode

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// A static pod's mirror-pod request waits edged's timeout only while the link is broken and edgehub has not yet
// noticed; linked, or once edgehub knows, it ends at once; with the imitation off, always at once.
func TestMirrorPodWaitFollowsEdgehubsView(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name          string
		mirrorTimeout time.Duration
		lostAt        time.Time
		at            time.Time
		want          time.Duration
	}{
		{"imitation off", 0, t0, t0.Add(time.Second), 0},
		{"linked", time.Minute, time.Time{}, t0, 0},
		{"cut 1 s ago, edgehub not aware", time.Minute, t0, t0.Add(time.Second), time.Minute},
		{"cut 5 s ago, edgehub aware", time.Minute, t0, t0.Add(5 * time.Second), 0},
		{"cut 35 s ago", time.Minute, t0, t0.Add(35 * time.Second), 0},
	} {
		e := edgehub{noticeAfter: 5 * time.Second, mirrorTimeout: tc.mirrorTimeout}
		if !tc.lostAt.IsZero() {
			e.linked(false, tc.lostAt)
			e.linked(false, tc.lostAt.Add(time.Second)) // still broken: the cut began at lostAt
		}
		if got := e.mirrorPodWait(tc.at); got != tc.want {
			t.Errorf("%s: waits %v, want %v", tc.name, got, tc.want)
		}
	}
}

// On the node: a static pod written in the first seconds of a cut runs only after the mirror-pod timeout.
func TestStaticPodWrittenBeforeEdgehubNoticesWaitsForItsMirrorPod(t *testing.T) {
	dir, manifests := t.TempDir(), t.TempDir()
	n := New(Config{NodeName: "edge-1", Client: fake.NewClientset(), StateDir: dir, StaticPodDir: manifests,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, SyncInterval: 20 * time.Millisecond})
	n.ImitateEdgehub(time.Minute, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	testkit.Until(t, waitLimit, "the node linked", n.cloudLinked.Load)
	n.setCloudLinked(false) // the cut: edgehub notices only after a minute
	written := time.Now()
	if err := os.WriteFile(filepath.Join(manifests, "trainer.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer\n"+
		"spec:\n  containers:\n  - name: main\n    image: sleeper:v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	running := func() bool { return ProcessRuns(PIDFile(dir, "default", "trainer-edge-1", "main")) }
	testkit.Until(t, waitLimit, "the static pod's process running", running)
	if waited := time.Since(written); waited < time.Second {
		t.Errorf("the static pod ran %v after its manifest, before its mirror-pod request timed out (1 s)", waited)
	}
}

// A disconnected edgehub tries again every retry cycle from when it lost its link: a link that works again is used
// at the next attempt; with the imitation off, at once.
func TestEdgehubReconnectsOnItsCycle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		name         string
		cycle        time.Duration
		back, askAt  time.Duration // the link works again at back; asked at askAt
		wantConnects bool
	}{
		{"imitation off", 0, 2 * time.Second, 2 * time.Second, true},
		{"back before the first attempt, asked before it", 55 * time.Second, 10 * time.Second, 30 * time.Second, false},
		{"back before the first attempt, asked at it", 55 * time.Second, 10 * time.Second, 55 * time.Second, true},
		{"back after the first attempt, asked before the second", 55 * time.Second, 60 * time.Second, 100 * time.Second, false},
		{"back after the first attempt, asked after the second", 55 * time.Second, 60 * time.Second, 111 * time.Second, true},
	} {
		e := edgehub{retryCycle: tc.cycle}
		if !e.connected(true, t0.Add(-time.Second)) {
			t.Fatalf("%s: not connected before the cut", tc.name)
		}
		e.connected(false, t0)
		e.connected(false, at(tc.back-time.Second))
		e.connected(true, at(tc.back))
		if got := e.connected(true, at(tc.askAt)); got != tc.wantConnects {
			t.Errorf("%s: connected %v at +%v, want %v", tc.name, got, tc.askAt, tc.wantConnects)
		}
	}
}

// Cut off, a static pod that mounts its service account's token does not start (metamanager has no token for a
// new pod), while one without starts as any static pod; linked again, it starts.
func TestStaticPodWithATokenVolumeWaitsForTheCloud(t *testing.T) {
	dir, manifests := t.TempDir(), t.TempDir()
	n := New(Config{NodeName: "edge-1", Client: fake.NewClientset(), StateDir: dir, StaticPodDir: manifests,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, SyncInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	testkit.Until(t, waitLimit, "the node linked", n.cloudLinked.Load)
	n.setCloudLinked(false)
	pod := func(name, volumes string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\nspec:\n  containers:\n  - name: main\n    image: sleeper:v1\n" + volumes
	}
	token := "  volumes:\n  - name: kube-api-access-x\n    projected:\n      sources:\n      - serviceAccountToken:\n          path: token\n"
	for name, manifest := range map[string]string{"copied.yaml": pod("copied", token), "stand-in.yaml": pod("stand-in", "")} {
		if err := os.WriteFile(filepath.Join(manifests, name), []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	runs := func(pod string) func() bool {
		return func() bool { return ProcessRuns(PIDFile(dir, "default", pod+"-edge-1", "main")) }
	}
	testkit.Until(t, waitLimit, "the static pod without a token volume running", runs("stand-in"))
	// Both were added in one pass and synced in every one since: the copy's containers were never started.
	copies := n.runtimesWhere(func(p *corev1.Pod) bool { return p.Name == "copied-edge-1" })
	if len(copies) != 1 {
		t.Fatalf("%d pods of the copied manifest on the node, want 1", len(copies))
	}
	for _, rt := range copies {
		rt.mu.Lock()
		started := len(rt.procs)
		rt.mu.Unlock()
		if started != 0 {
			t.Fatal("a static pod with a token volume started while the node was cut off")
		}
	}
	n.setCloudLinked(true)
	testkit.Until(t, waitLimit, "the static pod with a token volume running once linked", runs("copied"))
}
