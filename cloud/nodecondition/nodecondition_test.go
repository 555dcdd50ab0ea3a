package nodecondition

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

func TestConditionSaysWhatTheTableHoldsOfTheAgent(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	beat := now.Add(-2 * time.Second)
	tests := []struct {
		name   string
		agent  liveness.AgentState
		status corev1.ConditionStatus
		reason string
	}{
		{"never heard", liveness.AgentState{}, corev1.ConditionUnknown, ReasonNeverHeard},
		{"heard, reaches the API server", liveness.AgentState{Heard: true, Online: true, APIKnown: true, APIReachable: true, LastHeartbeat: beat},
			corev1.ConditionTrue, ReasonConnected},
		{"heard, has not said yet", liveness.AgentState{Heard: true, Online: true, LastHeartbeat: beat}, corev1.ConditionTrue, ReasonConnected},
		{"heard, cut off from the API server", liveness.AgentState{Heard: true, Online: true, APIKnown: true, LastHeartbeat: beat},
			corev1.ConditionFalse, ReasonAPIServerUnreachable},
		{"silent", liveness.AgentState{Heard: true, APIKnown: true, APIReachable: true, LastHeartbeat: beat}, corev1.ConditionFalse, ReasonSilent},
		{"silent, last said cut off", liveness.AgentState{Heard: true, APIKnown: true, LastHeartbeat: beat}, corev1.ConditionFalse, ReasonSilent},
		{"stopped", liveness.AgentState{Heard: true, Stopped: true, APIKnown: true, APIReachable: true, LastHeartbeat: beat},
			corev1.ConditionFalse, ReasonStopped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Condition(tt.agent, now)
			if c.Type != Type || c.Status != tt.status || c.Reason != tt.reason || c.Message == "" {
				t.Errorf("condition %+v, want %s %s %s with a message", c, Type, tt.status, tt.reason)
			}
			wantBeat := now
			if tt.agent.Heard {
				wantBeat = beat
			}
			if !c.LastHeartbeatTime.Time.Equal(wantBeat) {
				t.Errorf("heartbeat time %v, want %v", c.LastHeartbeatTime, wantBeat)
			}
		})
	}
}
