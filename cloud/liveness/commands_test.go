package liveness

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// [P-CMD-5] On a real node one death drew 24 restart commands in 12 s: a new command per state seq, each stop
// re-stamping the exited container. A dead worker keeps its episode, and gets one command for it, with
// epoch = episode; a death after it came back is a new episode and gets its own.
func TestOneCommandPerDeathEpisode(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	pod := b.addPod("edge1", "default", "w", "u1")
	b.cutOff("edge1", now)
	decide := func(at time.Time) {
		if _, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, at), true, at); err != nil {
			t.Fatal(err)
		}
	}
	seq := uint64(10)
	for i := range 24 { // a dead worker re-stamped every half second: new seqs, one episode
		seq++
		at := now.Add(time.Duration(i) * 500 * time.Millisecond)
		b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: seq, Episode: 11, Phase: lifelinev1.Phase_PHASE_FAILED}, at)
		b.heartbeat("edge1", 1, uint64(i+2), false, at)
		decide(at)
	}
	if len(b.out.sent) != 1 || b.out.sent[0].Id != "rebuild/u1/11" || b.out.sent[0].Epoch != 11 {
		t.Fatalf("commands %v for one death, want one, rebuild/u1/11 with epoch 11", b.out.sent)
	}
	later := now.Add(time.Minute)
	b.heartbeat("edge1", 1, 100, false, later)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 40, Episode: 40, Phase: lifelinev1.Phase_PHASE_RUNNING}, later)
	decide(later)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 41, Episode: 41, Phase: lifelinev1.Phase_PHASE_FAILED}, later)
	decide(later)
	if len(b.out.sent) != 2 || b.out.sent[1].Id != "rebuild/u1/41" || b.out.sent[1].Epoch != 41 {
		t.Errorf("commands %v, want a second one for the second death, epoch 41", b.out.sent)
	}
}

// [P-CMD-5] At most one command per worker per commandSpacing, and a node's commands from a token bucket. A
// command held back is counted, and its worker is woken when the limit lets it go, so it is sent then.
func TestCommandsRateLimitedPerWorkerAndNode(t *testing.T) {
	b := newBench(t)
	ch := b.tr.Subscribe()
	now := time.Unix(1000, 0)
	b.cutOff("edge1", now)
	pods := make([]*corev1.Pod, 0, 15)
	var names []string
	for i := range 15 {
		name := fmt.Sprintf("w%d", i)
		pods, names = append(pods, b.addPod("edge1", "default", name, name)), append(names, name)
		b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: name, Uid: name, Seq: 5, Episode: 5, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	}
	b.tr.tick(now) // the node is online
	act := func(at time.Time) {
		for _, p := range pods {
			if _, err := b.tr.HealDead(b.out, p, b.tr.ViewOf(p, false, at), true, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	act(now)
	if len(b.out.sent) != nodeCommandBurst {
		t.Fatalf("%d commands at once to one node, want the burst of %d", len(b.out.sent), nodeCommandBurst)
	}
	if got := testutil.ToFloat64(b.tr.throttled.WithLabelValues(limitNode)); got != 15-nodeCommandBurst {
		t.Errorf("%v commands held back by the node's limit, want %d", got, 15-nodeCommandBurst)
	}
	waitFor(t, ch, names...) // what the states and the node's coming online changed
	b.heartbeat("edge1", 1, 2, false, now.Add(3*time.Second))
	b.tr.tick(now.Add(3 * time.Second)) // 2 per second: room for all five
	waitFor(t, ch, names[nodeCommandBurst:]...)
	act(now.Add(3 * time.Second))
	if len(b.out.sent) != 15 {
		t.Errorf("%d commands after the wait, want all 15", len(b.out.sent))
	}

	// w0 came back and died again at once: a new episode, within commandSpacing of its last command.
	again := now.Add(4 * time.Second)
	b.heartbeat("edge1", 1, 3, false, again)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w0", Uid: "w0", Seq: 7, Episode: 7, Phase: lifelinev1.Phase_PHASE_FAILED}, again)
	waitFor(t, ch, "w0")
	if id, _ := b.tr.HealDead(b.out, pods[0], b.tr.ViewOf(pods[0], false, again), true, again); id != "" {
		t.Errorf("command %s within %s of the worker's last", id, commandSpacing)
	}
	if got := testutil.ToFloat64(b.tr.throttled.WithLabelValues(limitWorker)); got != 1 {
		t.Errorf("%v held back by the worker's limit, want 1", got)
	}
	due := now.Add(commandSpacing)
	b.heartbeat("edge1", 1, 4, false, due)
	b.tr.tick(due)
	waitFor(t, ch, "w0")
	if id, _ := b.tr.HealDead(b.out, pods[0], b.tr.ViewOf(pods[0], false, due), true, due); id != "rebuild/w0/7" {
		t.Errorf("command %q once the limit ran out, want restart/w0/7", id)
	}
}

// waitFor reads the subscriber until it delivered every named pod.
func waitFor(t *testing.T, ch <-chan event.GenericEvent, names ...string) {
	t.Helper()
	missing := map[string]bool{}
	for _, n := range names {
		missing[n] = true
	}
	deadline := time.After(10 * time.Second)
	for len(missing) > 0 {
		select {
		case ev := <-ch:
			delete(missing, ev.Object.GetName())
		case <-deadline:
			t.Fatalf("%v not delivered", missing)
		}
	}
}

// The heal decision for every phase and restart policy.
func TestHealAction(t *testing.T) {
	cases := []struct {
		phase  lifelinev1.Phase
		policy corev1.RestartPolicy
		want   lifelinev1.Action
		heal   bool
	}{
		{lifelinev1.Phase_PHASE_FAILED, corev1.RestartPolicyNever, lifelinev1.Action_ACTION_REBUILD, true},
		{lifelinev1.Phase_PHASE_FAILED, corev1.RestartPolicyAlways, lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_FAILED, corev1.RestartPolicyOnFailure, lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_FAILED, "", lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_GONE, corev1.RestartPolicyOnFailure, lifelinev1.Action_ACTION_REBUILD, true},
		{lifelinev1.Phase_PHASE_GONE, corev1.RestartPolicyAlways, lifelinev1.Action_ACTION_REBUILD, true},
		{lifelinev1.Phase_PHASE_SUCCEEDED, corev1.RestartPolicyAlways, lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_SUCCEEDED, corev1.RestartPolicyOnFailure, lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_SUCCEEDED, corev1.RestartPolicyNever, lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_RUNNING, corev1.RestartPolicyAlways, lifelinev1.Action_ACTION_UNSPECIFIED, false},
		{lifelinev1.Phase_PHASE_PENDING, corev1.RestartPolicyAlways, lifelinev1.Action_ACTION_UNSPECIFIED, false},
	}
	for _, c := range cases {
		if got, heal := healAction(c.phase, c.policy); heal != c.heal || (heal && got != c.want) {
			t.Errorf("healAction(%s, %q) = %s, %v; want %s, %v", c.phase, c.policy, got, heal, c.want, c.heal)
		}
	}
}

// The rate limits' decision, step by step.
func TestCommandGate(t *testing.T) {
	now := time.Unix(1000, 0)
	var bucket tokenBucket
	var limit string
	for range nodeCommandBurst {
		if bucket, limit, _ = commandGate(time.Time{}, bucket, now); limit != "" {
			t.Fatalf("held back within the burst by %s", limit)
		}
	}
	_, limit, retry := commandGate(time.Time{}, bucket, now)
	if limit != limitNode || !retry.Equal(now.Add(500*time.Millisecond)) {
		t.Errorf("past the burst: %q until %v, want node until +500ms", limit, retry)
	}
	if _, limit, _ = commandGate(time.Time{}, bucket, now.Add(500*time.Millisecond)); limit != "" {
		t.Errorf("held back by %s after a token's time", limit)
	}
	if _, limit, retry = commandGate(now, tokenBucket{}, now.Add(time.Second)); limit != limitWorker || !retry.Equal(now.Add(commandSpacing)) {
		t.Errorf("a worker commanded a second ago: %q until %v", limit, retry)
	}
	if _, limit, _ = commandGate(now, tokenBucket{}, now.Add(-time.Hour).Add(commandSpacing)); limit != limitWorker {
		t.Errorf("a clock that went back let a command through: %q", limit)
	}
}

// failingCommands fails every publish, as a broker session that is down.
type failingCommands struct{}

func (failingCommands) PublishCommand(string, []byte) error { return errors.New("no session") }

// A command that could not be published is not taken as sent: the next reconcile sends it, rate limits
// unspent.
func TestUnsentCommandIsTriedAgain(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	pod := b.addPod("edge1", "default", "w", "u1")
	b.cutOff("edge1", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 3, Episode: 3, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	if id, err := b.tr.HealDead(failingCommands{}, pod, b.tr.ViewOf(pod, false, now), true, now); err == nil || id != "" {
		t.Fatalf("publish failure: %q, %v; want an error", id, err)
	}
	if id, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, now), true, now); err != nil || id != "rebuild/u1/3" {
		t.Errorf("the retry sent %q, %v; want rebuild/u1/3 at once", id, err)
	}
}

// [P-CMD-6] A worker that failed, or exited 0, where its node runs it again by itself (restartPolicy Always or
// OnFailure for a failure, Always for an exit 0) gets no command: the node restarts it under its crash back-off,
// and a restart through the MetaServer only stops containers. Only a failure under Never, which the node never
// runs again, is rebuilt; an exit 0 under OnFailure or Never is completion.
func TestNoCommandForAWorkerItsNodeRestarts_P_CMD_6(t *testing.T) {
	for _, c := range []struct {
		phase   lifelinev1.Phase
		policy  corev1.RestartPolicy
		command string
	}{
		{lifelinev1.Phase_PHASE_FAILED, corev1.RestartPolicyAlways, ""},
		{lifelinev1.Phase_PHASE_FAILED, "", ""},
		{lifelinev1.Phase_PHASE_FAILED, corev1.RestartPolicyOnFailure, ""},
		{lifelinev1.Phase_PHASE_FAILED, corev1.RestartPolicyNever, "rebuild/u1/3"},
		{lifelinev1.Phase_PHASE_SUCCEEDED, corev1.RestartPolicyAlways, ""},
		{lifelinev1.Phase_PHASE_SUCCEEDED, corev1.RestartPolicyOnFailure, ""},
		{lifelinev1.Phase_PHASE_SUCCEEDED, corev1.RestartPolicyNever, ""},
	} {
		t.Run(fmt.Sprintf("%s under %q", c.phase, c.policy), func(t *testing.T) {
			b := newBench(t)
			now := time.Unix(1000, 0)
			pod := b.addPod("edge1", "default", "w", "u1")
			pod.Spec.RestartPolicy = c.policy
			b.cutOff("edge1", now)
			b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 3, Episode: 3, Phase: c.phase}, now)
			id, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, now), true, now)
			want := 0
			if c.command != "" {
				want = 1
			}
			if err != nil || id != c.command || len(b.out.sent) != want {
				t.Errorf("command %q (%v), %d sent; want %q", id, err, len(b.out.sent), c.command)
			}
		})
	}
}
