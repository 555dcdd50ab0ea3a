package agent

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// [P-HEAL-1] A worker killed on a node cut off from the API server and the broker, under restartPolicy Always,
// is the node's to restart: the hollow node (as edged) starts it again after its crash back-off. The agent
// leaves it alone — a restart through the MetaServer only stops containers — however long it stays dead and
// however many cooldowns pass: no action, no local result.
func TestHealerLeavesACrashedWorkerToTheNodesRestart_P_HEAL_1(t *testing.T) {
	dir := t.TempDir()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainer-0", UID: "uid-1"},
		Spec: corev1.PodSpec{NodeName: "edge-1", RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{Name: "main", Image: "sleeper:v1"}}}}
	node := simnode.New(simnode.Config{NodeName: "edge-1", Client: fake.NewClientset(pod), StateDir: dir,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, CrashBackoff: 3 * time.Second, SyncInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testkit.Background(t, ctx, func(ctx context.Context) { _ = node.Run(ctx) }) // the node writes into its state directory
	socket := filepath.Join(dir, "cri.sock")
	go func() { _ = node.ServeCRI(ctx, socket) }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = node.ServeMetaServer(ctx, l) }()
	runtime, err := cri.Dial(socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close()

	j, err := journal.Open(filepath.Join(dir, "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	pub, rebuild := &memPublisher{}, &recordingRebuilder{}
	// A cooldown well under the back-off: an agent that acted on such a death would act several times.
	a, err := New(Config{Cluster: "c", Node: "edge-1", Source: runtime, Publisher: pub, Store: j, Rebuilder: rebuild, Log: logr.Discard(),
		Timing:       core.HealTiming{DeadFor: 200 * time.Millisecond, Cooldown: 300 * time.Millisecond},
		Workers:      fixedWorkers{{Namespace: "default", Name: "trainer-0", UID: "uid-1", OfflinePolicy: "Restart", RestartPolicy: "Always"}},
		APIReachable: func() bool { return false }, BrokerUp: func() bool { return false }, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go a.Run(ctx)

	mainContainer := func() (cri.Container, bool) {
		pods, err := runtime.Pods(ctx)
		if err != nil || len(pods) != 1 || len(pods[0].Containers) != 1 {
			return cri.Container{}, false
		}
		return pods[0].Containers[0], true
	}
	testkit.Until(t, 10*time.Second, "the worker runs", func() bool { c, ok := mainContainer(); return ok && c.Running })
	data, err := os.ReadFile(simnode.PIDFile(dir, "default", "trainer-0", "main"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			c, _ := mainContainer()
			t.Logf("container %+v", c)
			for _, e := range pub.snapshot() {
				t.Logf("%s %x", e.Topic, e.Payload)
			}
		}
	}()
	testkit.Until(t, 15*time.Second, "the worker runs again", func() bool { c, ok := mainContainer(); return ok && c.Running && c.Attempt == 1 })
	t.Logf("killed -> running again in %v (the node's back-off is 3s)", time.Since(killed).Round(time.Millisecond))

	if results, rebuilt := pub.results(t), rebuild.snapshot(); len(results) != 0 || len(rebuilt) != 0 {
		out, _ := json.Marshal(results)
		t.Fatalf("local results %s, rebuilt %v; want none: the node restarts the worker itself", out, rebuilt)
	}
}
