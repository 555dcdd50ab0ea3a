package federatedlearning

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// Defaults of spec.runPolicy, as documented in docs/api.md; the CRD applies the same ones to new objects.
const (
	DefaultBackoffLimit          = 6
	DefaultBackoffLimitPerWorker = 3
	DefaultBackoffSeconds        = 10
	DefaultMaxBackoffSeconds     = 360
)

// runPolicy is spec.runPolicy with every default applied.
type runPolicy struct {
	backoffLimit, backoffLimitPerWorker int32
	backoff, maxBackoff                 time.Duration
	activeDeadline, ttlAfterFinished    *time.Duration
	trainersOnCompletion                v1alpha1.TrainerCompletionPolicy
}

func effectivePolicy(job *v1alpha1.FederatedLearningJob) runPolicy {
	p := runPolicy{
		backoffLimit:          DefaultBackoffLimit,
		backoffLimitPerWorker: DefaultBackoffLimitPerWorker,
		backoff:               DefaultBackoffSeconds * time.Second,
		maxBackoff:            DefaultMaxBackoffSeconds * time.Second,
		trainersOnCompletion:  v1alpha1.TrainersStop,
	}
	rp := job.Spec.RunPolicy
	if rp == nil {
		return p
	}
	if rp.BackoffLimit != nil {
		p.backoffLimit = *rp.BackoffLimit
	}
	if rp.BackoffLimitPerWorker != nil {
		p.backoffLimitPerWorker = *rp.BackoffLimitPerWorker
	}
	if rp.BackoffSeconds != nil {
		p.backoff = time.Duration(*rp.BackoffSeconds) * time.Second
	}
	if rp.MaxBackoffSeconds != nil {
		p.maxBackoff = time.Duration(*rp.MaxBackoffSeconds) * time.Second
	}
	if rp.ActiveDeadlineSeconds != nil {
		d := time.Duration(*rp.ActiveDeadlineSeconds) * time.Second
		p.activeDeadline = &d
	}
	if rp.TTLSecondsAfterFinished != nil {
		d := time.Duration(*rp.TTLSecondsAfterFinished) * time.Second
		p.ttlAfterFinished = &d
	}
	if rp.TrainersOnCompletion != "" {
		p.trainersOnCompletion = rp.TrainersOnCompletion
	}
	return p
}

// retryDelay is how long to wait before re-creating a worker that has failed `failures` times: the base delay,
// doubled for each earlier failure, capped.
func (p runPolicy) retryDelay(failures int32) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := p.backoff
	for i := int32(1); i < failures && d < p.maxBackoff; i++ {
		d *= 2
	}
	return min(d, p.maxBackoff)
}

// endedByDisruption tells whether a failed pod was ended from outside — eviction, preemption, the node lifecycle
// controller, a drain — rather than by its own containers. Such an end is not charged to the retry budgets.
func endedByDisruption(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	switch pod.Status.Reason {
	case "Evicted", "Preempting", "NodeLost", "Shutdown", "Terminated", "NodeAffinity":
		return true
	}
	return false
}

// containerRestarts sums the restarts of a pod's containers; under restartPolicy OnFailure each is a failure of
// the worker, as a batch Job counts it.
func containerRestarts(pod *corev1.Pod) int32 {
	var n int32
	for _, c := range pod.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

func isTerminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}
