package conditions

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNormalize(t *testing.T) {
	now := metav1.NewTime(time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC))
	earlier := metav1.NewTime(now.Add(-time.Hour))
	onlyLifeline := func(t string) bool { return t == "Ready" }
	tests := []struct {
		name        string
		in          []metav1.Condition
		keep        func(string) bool
		want        []metav1.Condition
		wantChanged bool
	}{{
		name: "nothing stored",
	}, {
		name: "Lifeline's own conditions pass unchanged",
		in:   []metav1.Condition{{Type: "Training", Status: metav1.ConditionTrue, Reason: "WorkersRunning", LastTransitionTime: earlier}},
		want: []metav1.Condition{{Type: "Training", Status: metav1.ConditionTrue, Reason: "WorkersRunning", LastTransitionTime: earlier}},
	}, {
		// Sedna's GM: NewJobCondition(FLJobCondComplete, "", "") with lastProbeTime/lastHeartbeatTime only.
		name:        "GM's Complete without reason nor transition time",
		in:          []metav1.Condition{{Type: "Complete", Status: metav1.ConditionTrue}},
		want:        []metav1.Condition{{Type: "Complete", Status: metav1.ConditionTrue, Reason: "Complete", LastTransitionTime: now}},
		wantChanged: true,
	}, {
		name:        "GM's Failed keeps its reason",
		in:          []metav1.Condition{{Type: "Failed", Status: metav1.ConditionTrue, Reason: "workerFailed", Message: "the worker of FederatedLearningJob failed"}},
		want:        []metav1.Condition{{Type: "Failed", Status: metav1.ConditionTrue, Reason: "workerFailed", Message: "the worker of FederatedLearningJob failed", LastTransitionTime: now}},
		wantChanged: true,
	}, {
		name:        "a condition not True gets the unspecified reason",
		in:          []metav1.Condition{{Type: "Training", Status: metav1.ConditionFalse, LastTransitionTime: earlier}},
		want:        []metav1.Condition{{Type: "Training", Status: metav1.ConditionFalse, Reason: ReasonUnspecified, LastTransitionTime: earlier}},
		wantChanged: true,
	}, {
		// GM's JI controller appends a condition on every change of type: Running, Failed, Running.
		name: "a repeated type keeps its last",
		in: []metav1.Condition{
			{Type: "Running", Status: metav1.ConditionTrue, LastTransitionTime: earlier},
			{Type: "Failed", Status: metav1.ConditionTrue, Reason: "workerFailed", LastTransitionTime: earlier},
			{Type: "Running", Status: metav1.ConditionTrue, Message: "latest", LastTransitionTime: earlier},
		},
		want: []metav1.Condition{
			{Type: "Failed", Status: metav1.ConditionTrue, Reason: "workerFailed", LastTransitionTime: earlier},
			{Type: "Running", Status: metav1.ConditionTrue, Reason: "Running", Message: "latest", LastTransitionTime: earlier},
		},
		wantChanged: true,
	}, {
		name: "types Lifeline does not keep are dropped",
		in: []metav1.Condition{
			{Type: "Running", Status: metav1.ConditionTrue, LastTransitionTime: earlier},
			{Type: "Ready", Status: metav1.ConditionTrue, Reason: "WorkersAvailable", LastTransitionTime: earlier},
		},
		keep:        onlyLifeline,
		want:        []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "WorkersAvailable", LastTransitionTime: earlier}},
		wantChanged: true,
	}, {
		name:        "only dropped types leave none",
		in:          []metav1.Condition{{Type: "Running", Status: metav1.ConditionTrue}},
		keep:        onlyLifeline,
		wantChanged: true,
	}, {
		name:        "a missing status is Unknown",
		in:          []metav1.Condition{{Type: "Complete", Reason: "X", LastTransitionTime: earlier}},
		want:        []metav1.Condition{{Type: "Complete", Status: metav1.ConditionUnknown, Reason: "X", LastTransitionTime: earlier}},
		wantChanged: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed := Normalize(tt.in, tt.keep, now)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Normalize (-want +got):\n%s", diff)
			}
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
		})
	}
}
