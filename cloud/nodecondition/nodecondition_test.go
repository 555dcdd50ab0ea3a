package nodecondition

import (
	"strings"
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

// An agent that keeps no stand-in for some of its node's workers (a tenant's pods beyond its size bounds) says so,
// and the Node's condition tells how many, in its message: the status and reason stay what the link makes them.
func TestConditionTellsWorkersThatGetNoOfflineHealing(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	agent := liveness.AgentState{Heard: true, Online: true, APIKnown: true, APIReachable: true, LastHeartbeat: now, OversizedWorkers: 20}
	c := Condition(agent, now)
	if c.Status != corev1.ConditionTrue || c.Reason != ReasonConnected || !strings.Contains(c.Message, "20 of the node's workers get no offline healing") {
		t.Errorf("condition %s %s %q", c.Status, c.Reason, c.Message)
	}
	agent.OversizedWorkers = 0
	if c2 := Condition(agent, now); same(c, c2) {
		t.Error("the message does not change when the tenant's pods are gone: the condition would not be written again")
	}
}
