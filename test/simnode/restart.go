package simnode

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// restartDecision says whether a container that exited with code should run again under policy.
func shouldRestart(policy corev1.RestartPolicy, code int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default:
		return true
	}
}

// crashLoopStable is how long after its last restart a container must exit for its back-off to begin again from
// the base: the kubelet's (and so edged's) container back-off counts an exit as a new crash unless it came more
// than 600 s after the back-off was last stepped, which it is when the container starts.
const crashLoopStable = 10 * time.Minute

// nextBackoffStep is the back-off step of a container that ran from startedAt to finished, its previous step
// prev (0: never restarted): one more, or 1 again once it had run stably.
func nextBackoffStep(prev int32, startedAt, finished time.Time) int32 {
	if prev == 0 || finished.Sub(startedAt) > crashLoopStable {
		return 1
	}
	return prev + 1
}

// crashBackoff is the wait before the n-th restart (n ≥ 1): base doubled for each earlier restart, capped, as
// the kubelet's CrashLoopBackOff does.
func crashBackoff(base, max time.Duration, n int32) time.Duration {
	d := base
	for i := int32(1); i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// podPhase derives a pod's phase from its containers under its restart policy. A container waiting to be
// restarted has run before, so its pod stays Running, as the kubelet reports it.
func podPhase(policy corev1.RestartPolicy, statuses []corev1.ContainerStatus) corev1.PodPhase {
	allTerminated, anyFailed, anyRunning := true, false, false
	for _, cs := range statuses {
		s := cs.State
		switch {
		case s.Running != nil || (s.Waiting != nil && cs.RestartCount > 0):
			anyRunning, allTerminated = true, false
		case s.Terminated != nil:
			if s.Terminated.ExitCode != 0 {
				anyFailed = true
			}
		default:
			allTerminated = false
		}
	}
	switch {
	case len(statuses) == 0:
		return corev1.PodPending
	case allTerminated && policy == corev1.RestartPolicyNever && anyFailed:
		return corev1.PodFailed
	case allTerminated && policy != corev1.RestartPolicyAlways && !anyFailed:
		return corev1.PodSucceeded
	case anyRunning || allTerminated:
		return corev1.PodRunning
	default:
		return corev1.PodPending
	}
}
