package simnode

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestShouldRestart(t *testing.T) {
	cases := []struct {
		policy corev1.RestartPolicy
		code   int
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 137, true},
		{corev1.RestartPolicyNever, 1, false},
		{"", 0, true},
	}
	for _, tc := range cases {
		if got := shouldRestart(tc.policy, tc.code); got != tc.want {
			t.Errorf("shouldRestart(%s, %d) = %v, want %v", tc.policy, tc.code, got, tc.want)
		}
	}
}

func TestCrashBackoff(t *testing.T) {
	for n, want := range map[int32]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 8 * time.Second, 40: 8 * time.Second} {
		if got := crashBackoff(time.Second, 8*time.Second, n); got != want {
			t.Errorf("crashBackoff(n=%d) = %v, want %v", n, got, want)
		}
	}
}

func TestPodPhase(t *testing.T) {
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	ok := corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}
	bad := corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}}
	pulling := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	crashLoop := corev1.ContainerStatus{RestartCount: 2, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}
	cases := []struct {
		name     string
		policy   corev1.RestartPolicy
		statuses []corev1.ContainerStatus
		want     corev1.PodPhase
	}{
		{"running", corev1.RestartPolicyAlways, []corev1.ContainerStatus{running}, corev1.PodRunning},
		{"not started", corev1.RestartPolicyAlways, []corev1.ContainerStatus{pulling}, corev1.PodPending},
		{"crash loop stays Running", corev1.RestartPolicyAlways, []corev1.ContainerStatus{crashLoop}, corev1.PodRunning},
		{"done under OnFailure", corev1.RestartPolicyOnFailure, []corev1.ContainerStatus{ok}, corev1.PodSucceeded},
		{"failed under Never", corev1.RestartPolicyNever, []corev1.ContainerStatus{bad}, corev1.PodFailed},
		{"exited under Always stays Running", corev1.RestartPolicyAlways, []corev1.ContainerStatus{ok}, corev1.PodRunning},
		{"one of two done", corev1.RestartPolicyNever, []corev1.ContainerStatus{ok, running}, corev1.PodRunning},
	}
	for _, tc := range cases {
		if got := podPhase(tc.policy, tc.statuses); got != tc.want {
			t.Errorf("%s: phase %s, want %s", tc.name, got, tc.want)
		}
	}
}
