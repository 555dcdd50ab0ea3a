package edgeaware

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// [P-HEAL-2] Cut off from everything, the agent healed a failed trainer alone; when the broker is back its
// replay brings the dead state and the local result of the same death. No command follows for that death, and
// the agent's answer to one sent before the result arrived (a duplicate) is no Warning.
func TestADeathHealedOfflineGetsNoCommandNorWarning_P_HEAL_2(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	pod := b.addPod("edge1", "default", "w", "u1")
	b.cutOff("edge1", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 7, Episode: 7, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/u1/1", Outcome: lifelinev1.Outcome_OUTCOME_DONE, Namespace: "default",
		Pod: "w", PodUid: "u1", Local: true, Epoch: 7, BirthSeq: 1}, now)
	if id, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, now), true, now); id != "" || err != nil {
		t.Errorf("command %q (%v) sent for a death the agent healed", id, err)
	}

	// A death of the next episode, commanded before the agent's answer that it had acted already.
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 9, Episode: 9, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	id, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, now), true, now.Add(time.Minute))
	if id == "" || err != nil {
		t.Fatalf("no command for a new death: %v", err)
	}
	b.result("edge1", &lifelinev1.CommandResult{CommandId: id, Outcome: lifelinev1.Outcome_OUTCOME_DUPLICATE, Namespace: "default",
		Pod: "w", PodUid: "u1", Message: "the agent already acted on episode 9 of the worker", BirthSeq: 1}, now.Add(time.Minute))
	events, err := (&Edge{Tracker: b.tr}).Act([]*corev1.Pod{pod}, map[string]liveness.View{}, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.Type == corev1.EventTypeWarning {
			t.Errorf("Warning %s: %s", ev.Reason, ev.Message)
		}
	}
	if len(events) != 1 || events[0].Reason != ReasonRestartedOffline || events[0].Node != "edge1" ||
		events[0].RelatedNode().GetName() != "edge1" {
		t.Errorf("events %+v, want the offline heal only, related to its node", events)
	}
}

// [P-HEAL-1] Only the offline policy None keeps the agent from healing a worker while its node is cut off; an
// absent policy, or one the agent does not know, is Restart.
func TestHealsOffline_P_HEAL_1(t *testing.T) {
	cases := []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{"no policy", nil, true},
		{"Restart", map[string]string{lifelinev1.OfflinePolicyAnnotation: lifelinev1.OfflinePolicyRestart}, true},
		{"None", map[string]string{lifelinev1.OfflinePolicyAnnotation: lifelinev1.OfflinePolicyNone}, false},
		{"unknown value", map[string]string{lifelinev1.OfflinePolicyAnnotation: "Reboot"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}}
			if got := HealsOffline(pod); got != tc.want {
				t.Errorf("HealsOffline = %v, want %v", got, tc.want)
			}
		})
	}
}

// [P-HEAL-1] A worker whose offline policy is None is left dead on its cut-off node: Act sends its agent no
// command, where it commands the heal of the same death under Restart.
func TestActCommandsAHealByTheOfflinePolicy_P_HEAL_1(t *testing.T) {
	cases := []struct {
		policy      string
		wantCommand bool
	}{
		{lifelinev1.OfflinePolicyRestart, true},
		{lifelinev1.OfflinePolicyNone, false},
	}
	for _, tc := range cases {
		t.Run(tc.policy, func(t *testing.T) {
			b := newBench(t)
			now := time.Unix(1000, 0)
			pod := b.addPod("edge1", "default", "w", "u1")
			pod.Annotations = map[string]string{lifelinev1.OfflinePolicyAnnotation: tc.policy}
			b.cutOff("edge1", now)
			b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 7, Episode: 7, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
			e := &Edge{Tracker: b.tr, Commands: b.out}
			events, err := e.Act([]*corev1.Pod{pod}, map[string]liveness.View{"w": b.tr.ViewOf(pod, false, now)}, now)
			if err != nil {
				t.Fatal(err)
			}
			commanded := len(events) == 1 && events[0].Reason == ReasonRestartCommandSent
			if commanded != tc.wantCommand || len(b.out.sent) != len(events) {
				t.Errorf("events %+v, commands %v; want a command: %v", events, b.out.sent, tc.wantCommand)
			}
		})
	}
}
