package lifelinev1

import "testing"

// What is rebuilt while a node is cut off: a worker the node will never run again — its pod lost, or failed under
// restartPolicy Never. A failure under Always or OnFailure, and an exit 0 under Always, the node restarts itself;
// an exit 0 under OnFailure or Never is completion.
func TestNodeNeverRunsAgain(t *testing.T) {
	cases := []struct {
		phase  Phase
		policy string
		want   bool
	}{
		{Phase_PHASE_FAILED, "Never", true},
		{Phase_PHASE_FAILED, "OnFailure", false},
		{Phase_PHASE_FAILED, "Always", false},
		{Phase_PHASE_GONE, "OnFailure", true},
		{Phase_PHASE_GONE, "Always", true},
		{Phase_PHASE_SUCCEEDED, "Always", false},
		{Phase_PHASE_SUCCEEDED, "", false},
		{Phase_PHASE_SUCCEEDED, "OnFailure", false},
		{Phase_PHASE_SUCCEEDED, "Never", false},
		{Phase_PHASE_RUNNING, "Always", false},
		{Phase_PHASE_PENDING, "Always", false},
	}
	for _, tc := range cases {
		if got := NodeNeverRunsAgain(tc.phase, tc.policy); got != tc.want {
			t.Errorf("%s with restartPolicy %q: never runs again %v, want %v", tc.phase, tc.policy, got, tc.want)
		}
	}
}
