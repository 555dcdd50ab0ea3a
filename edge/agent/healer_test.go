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
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/edgesim"
)

// [P-HEAL-1] The offline policy acts only for a dead worker nobody else can restart.
func TestShouldHeal_P_HEAL_1(t *testing.T) {
	timing := HealTiming{APIGrace: 5 * time.Second, DeadFor: time.Second, ControllerWait: 5 * time.Second, Cooldown: 10 * time.Second}
	cutOff := healCase{dead: true, deadFor: 2 * time.Second, apiDownFor: time.Minute}
	with := func(edit func(*healCase)) healCase { c := cutOff; edit(&c); return c }
	cases := []struct {
		name string
		c    healCase
		want bool
	}{
		{"dead, cut off from API server and broker", cutOff, true},
		{"explicit Restart policy", with(func(c *healCase) { c.policy = "Restart" }), true},
		{"policy None", with(func(c *healCase) { c.policy = OfflinePolicyNone }), false},
		{"alive", with(func(c *healCase) { c.dead = false }), false},
		{"API server reachable", with(func(c *healCase) { c.apiDownFor = 0 }), false},
		{"API server out of reach for less than the grace", with(func(c *healCase) { c.apiDownFor = 4 * time.Second }), false},
		{"dead for less than DeadFor", with(func(c *healCase) { c.deadFor = 500 * time.Millisecond }), false},
		{"controller reachable: it decides first", with(func(c *healCase) { c.controllerReachable = true }), false},
		{"controller reachable but silent too long", with(func(c *healCase) { c.controllerReachable, c.deadFor = true, 6*time.Second }), true},
		{"restarted moments ago", with(func(c *healCase) { c.sinceLastHeal = 3 * time.Second }), false},
		{"restarted long ago", with(func(c *healCase) { c.sinceLastHeal = 11 * time.Second }), true},
	}
	for _, tc := range cases {
		if got := shouldHeal(timing, tc.c); got != tc.want {
			t.Errorf("%s: shouldHeal = %v, want %v", tc.name, got, tc.want)
		}
	}
}

type fixedWorkers []desired.Worker

func (f fixedWorkers) Workers() []desired.Worker { return f }

// [P-HEAL-1] A worker killed on a node cut off from the API server and the broker, under restartPolicy Always,
// is the node's to restart: the hollow node (as edged) starts it again after its crash back-off. The agent
// leaves it alone — a restart through the MetaServer only stops containers — however long it stays dead and
// however many cooldowns pass: no action, no local result.
func TestHealerLeavesACrashedWorkerToTheNodesRestart_P_HEAL_1(t *testing.T) {
	dir := t.TempDir()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainer-0", UID: "uid-1"},
		Spec: corev1.PodSpec{NodeName: "edge-1", RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{Name: "main", Image: "sleeper:v1"}}}}
	node := edgesim.New(edgesim.Config{NodeName: "edge-1", Client: fake.NewClientset(pod), StateDir: dir,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, CrashBackoff: 3 * time.Second, SyncInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan struct{})
	go func() { _ = node.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped }) // before the state directory is removed: the node writes into it
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
	healer := &Healer{Cluster: "c", Node: "edge-1", Publisher: pub, Rebuilder: rebuild, Log: logr.Discard(),
		Timing:       HealTiming{DeadFor: 200 * time.Millisecond, Cooldown: 300 * time.Millisecond},
		Workers:      fixedWorkers{{Namespace: "default", Name: "trainer-0", UID: "uid-1", OfflinePolicy: "Restart", RestartPolicy: "Always"}},
		APIReachable: func() bool { return false }, ControllerReachable: func() bool { return false }}
	observer := &Observer{Cluster: "c", Node: "edge-1", Source: runtime, Publisher: pub, Seq: j,
		Interval: 100 * time.Millisecond, OnPublished: healer.Observed}
	go observer.Run(ctx)
	go healer.Run(ctx, 50*time.Millisecond)

	mainContainer := func() (cri.Container, bool) {
		pods, err := runtime.Pods(ctx)
		if err != nil || len(pods) != 1 || len(pods[0].Containers) != 1 {
			return cri.Container{}, false
		}
		return pods[0].Containers[0], true
	}
	waitFor(t, 10*time.Second, "the worker runs", func() bool { c, ok := mainContainer(); return ok && c.Running })
	data, err := os.ReadFile(edgesim.PIDFile(dir, "default", "trainer-0", "main"))
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
	waitFor(t, 15*time.Second, "the worker runs again", func() bool { c, ok := mainContainer(); return ok && c.Running && c.Attempt == 1 })
	t.Logf("killed -> running again in %v (the node's back-off is 3s)", time.Since(killed).Round(time.Millisecond))

	var results []*lifelinev1.CommandResult
	for _, e := range pub.snapshot() {
		if strings.HasSuffix(e.Topic, "/results") {
			res := &lifelinev1.CommandResult{}
			if err := proto.Unmarshal(e.Payload, res); err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
		}
	}
	if len(results) != 0 || len(rebuild.rebuilt) != 0 {
		out, _ := json.Marshal(results)
		t.Fatalf("local results %s, rebuilt %v; want none: the node restarts the worker itself", out, rebuild.rebuilt)
	}
}

// On a cut-off node the offline policy rebuilds the FL trainer that failed under restartPolicy Never (the node
// never runs it again, and the cloud cannot replace it while the node is cut off), and leaves alone the JI
// worker that crashed or exited 0 and the trainer that failed under OnFailure (the node restarts those) and the
// trainer that exited 0 (it finished).
func TestHealerRebuildsOnlyWhatTheNodeNeverRunsAgain(t *testing.T) {
	rebuild := &recordingRebuilder{}
	workers := fixedWorkers{
		{Namespace: "default", Name: "ji-crashed", UID: "u1", RestartPolicy: "Always"},
		{Namespace: "default", Name: "ji-exited", UID: "u2", RestartPolicy: "Always"},
		{Namespace: "default", Name: "trainer-onfailure", UID: "u3", RestartPolicy: "OnFailure"},
		{Namespace: "default", Name: "trainer-never", UID: "u4", RestartPolicy: "Never"},
		{Namespace: "default", Name: "trainer-done", UID: "u5", RestartPolicy: "Never"},
	}
	phases := []lifelinev1.Phase{lifelinev1.Phase_PHASE_FAILED, lifelinev1.Phase_PHASE_SUCCEEDED, lifelinev1.Phase_PHASE_FAILED,
		lifelinev1.Phase_PHASE_FAILED, lifelinev1.Phase_PHASE_SUCCEEDED}
	h := &Healer{Workers: workers, Rebuilder: rebuild, APIReachable: func() bool { return false }, Timing: DefaultHealTiming, Log: logr.Discard()}
	start := time.Unix(1000, 0)
	h.HealOnce(context.Background(), start)
	for i, w := range workers {
		h.Observed(&lifelinev1.WorkerState{Namespace: w.Namespace, Name: w.Name, Uid: w.UID, Phase: phases[i],
			Seq: uint64(10 + i), Episode: uint64(10 + i), ObservedUnixNano: start.UnixNano()})
	}
	h.HealOnce(context.Background(), start.Add(6*time.Second))
	if len(rebuild.rebuilt) != 1 || rebuild.rebuilt[0] != "default/trainer-never" {
		t.Errorf("rebuilt %v, want the trainer that failed under Never only", rebuild.rebuilt)
	}
}

// The controller's command and the offline policy share one action per death: after the controller had a
// worker rebuilt for this episode, the healer does not rebuild it again; a new death (a new episode) is healed.
func TestHealerDoesNotActAgainOnADeathTheControllerHealed(t *testing.T) {
	episodes := &Episodes{}
	rebuild := &recordingRebuilder{}
	pub := &memPublisher{}
	cmds := &Commands{Cluster: "c", Node: "edge-1", Actuator: &recordingActuator{}, Rebuilder: rebuild, Publisher: pub, Episodes: episodes}
	h := &Healer{Workers: fixedWorkers{{Namespace: "default", Name: "w", UID: "u", RestartPolicy: "Never"}}, Rebuilder: rebuild,
		Episodes: episodes, APIReachable: func() bool { return false }, ControllerReachable: func() bool { return true },
		Timing: DefaultHealTiming, Log: logr.Discard()}
	start := time.Unix(1000, 0)
	dead := &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Phase: lifelinev1.Phase_PHASE_FAILED, Seq: 5, Episode: 5,
		ObservedUnixNano: start.UnixNano()}
	h.HealOnce(context.Background(), start)
	h.Observed(dead)
	cmds.Observed(dead)
	payload, _ := proto.Marshal(&lifelinev1.Command{Id: "rebuild/u/5", Namespace: "default", Pod: "w", PodUid: "u", Epoch: 5,
		Action: lifelinev1.Action_ACTION_REBUILD, TtlMillis: 30000})
	if err := cmds.Handle(context.Background(), payload); err != nil {
		t.Fatal(err)
	}
	// Still dead, past the wait for the controller and several cooldowns.
	restamped := proto.Clone(dead).(*lifelinev1.WorkerState)
	restamped.Seq = 6
	h.Observed(restamped)
	for s := 6; s <= 40; s += 2 {
		h.HealOnce(context.Background(), start.Add(time.Duration(s)*time.Second))
	}
	if len(rebuild.rebuilt) != 1 {
		t.Fatalf("rebuilt %v, want once (by the command) for one death", rebuild.rebuilt)
	}
	// It ran, and died again: a new episode, healed by the offline policy.
	h.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Phase: lifelinev1.Phase_PHASE_RUNNING, Seq: 7, Episode: 7})
	h.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Phase: lifelinev1.Phase_PHASE_FAILED, Seq: 8, Episode: 8,
		ObservedUnixNano: start.Add(41 * time.Second).UnixNano()})
	h.HealOnce(context.Background(), start.Add(47*time.Second))
	if len(rebuild.rebuilt) != 2 {
		t.Errorf("rebuilt %v, want the second death healed locally", rebuild.rebuilt)
	}
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("%s: not within %v", what, within)
}

type recordingRebuilder struct {
	rebuilt  []string
	released int
}

func (r *recordingRebuilder) Rebuild(_ context.Context, ns, pod, _ string) error {
	r.rebuilt = append(r.rebuilt, ns+"/"+pod)
	return nil
}

func (r *recordingRebuilder) Release() (int, error) { r.released++; return 1, nil }

// A worker whose pod the node lost is rebuilt while the node is cut off from everything; the rebuilt workers are
// handed back once the API server is reachable again.
func TestHealerRebuildsALostWorkerAndHandsItBack(t *testing.T) {
	reachable := false
	rebuild := &recordingRebuilder{}
	h := &Healer{Workers: fixedWorkers{{Namespace: "default", Name: "w", UID: "u"}}, Rebuilder: rebuild,
		APIReachable: func() bool { return reachable }, Timing: DefaultHealTiming, Log: logr.Discard()}
	start := time.Unix(1000, 0)
	h.HealOnce(context.Background(), start) // the API server went out of reach
	h.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Phase: lifelinev1.Phase_PHASE_GONE, ObservedUnixNano: start.UnixNano()})
	h.HealOnce(context.Background(), start.Add(6*time.Second))
	if len(rebuild.rebuilt) != 1 {
		t.Fatalf("rebuilt %v, want one rebuild", rebuild.rebuilt)
	}
	reachable = true
	h.HealOnce(context.Background(), start.Add(7*time.Second))
	h.HealOnce(context.Background(), start.Add(8*time.Second))
	if rebuild.released != 1 {
		t.Errorf("released %d times once the API server was back, want once", rebuild.released)
	}
}
