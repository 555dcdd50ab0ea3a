package federatedlearning

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

func TestRetryDelay(t *testing.T) {
	defaults := effectivePolicy(&v1alpha1.FederatedLearningJob{})
	custom := effectivePolicy(&v1alpha1.FederatedLearningJob{Spec: v1alpha1.FederatedLearningJobSpec{
		RunPolicy: &v1alpha1.RunPolicy{BackoffSeconds: ptr.To[int32](1), MaxBackoffSeconds: ptr.To[int32](5)}}})
	cases := []struct {
		name     string
		p        runPolicy
		failures int32
		want     time.Duration
	}{
		{"no failure, no wait", defaults, 0, 0},
		{"first failure waits the base", defaults, 1, 10 * time.Second},
		{"second doubles", defaults, 2, 20 * time.Second},
		{"sixth is 320s", defaults, 6, 320 * time.Second},
		{"seventh is capped at 6 min", defaults, 7, 6 * time.Minute},
		{"hundredth stays capped", defaults, 100, 6 * time.Minute},
		{"custom base", custom, 1, time.Second},
		{"custom cap", custom, 4, 5 * time.Second},
	}
	for _, tc := range cases {
		if got := tc.p.retryDelay(tc.failures); got != tc.want {
			t.Errorf("%s: retryDelay(%d) = %v, want %v", tc.name, tc.failures, got, tc.want)
		}
	}
}

func TestEndedByDisruption(t *testing.T) {
	cases := []struct {
		name string
		pod  corev1.PodStatus
		want bool
	}{
		{"container exited 1", corev1.PodStatus{Phase: corev1.PodFailed}, false},
		{"DisruptionTarget", corev1.PodStatus{Phase: corev1.PodFailed, Conditions: []corev1.PodCondition{
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI"}}}, true},
		{"DisruptionTarget false", corev1.PodStatus{Phase: corev1.PodFailed, Conditions: []corev1.PodCondition{
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionFalse}}}, false},
		{"kubelet eviction", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"}, true},
		{"node shutdown", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Shutdown"}, true},
	}
	for _, tc := range cases {
		if got := endedByDisruption(&corev1.Pod{Status: tc.pod}); got != tc.want {
			t.Errorf("%s: endedByDisruption = %v, want %v", tc.name, got, tc.want)
		}
	}
}
