package federatedlearning

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// event is an Event to emit once the pass's writes succeeded.
type event struct {
	eventType, reason, note string
}

// plan is what one pass decides, computed without I/O from the job, its workers and the clock.
type plan struct {
	status  v1alpha1.FederatedLearningJobStatus
	create  []identity    // missing workers to create now
	release []*corev1.Pod // pods to let go: their end is stored, or they are being deleted
	remove  []*corev1.Pod // pods to delete: counted failures (to make room), or active pods of a finished job
	finish  []*corev1.Pod // pods of a finished job that ended, to mark so: no agent stands in for them any more
	retryAt time.Time     // when a waiting retry or the deadline falls due; zero when nothing waits
	events  []event
}

// isJobCondition tells the condition types of a job; Sedna's are the same three.
func isJobCondition(t string) bool {
	return t == v1alpha1.FLConditionTraining || t == v1alpha1.FLConditionComplete || t == v1alpha1.FLConditionFailed
}

// finished tells whether a status carries a terminal condition.
func finished(s v1alpha1.FederatedLearningJobStatus) bool {
	return conditions.IsTrue(s.Conditions, v1alpha1.FLConditionComplete) || conditions.IsTrue(s.Conditions, v1alpha1.FLConditionFailed)
}

// decide is the heart of the controller: it counts how pods ended (each exactly once), charges failures to the
// budgets, and decides what to create, delete and release, and what the status becomes.
func decide(job *v1alpha1.FederatedLearningJob, workers []worker, p runPolicy, now time.Time) plan {
	out := plan{status: *job.Status.DeepCopy()}
	s := &out.status
	mnow := metav1.NewTime(now)
	// A status Sedna's GM wrote lacks what Lifeline's schema requires of a condition; made whole here, it can be
	// written back.
	s.Conditions, _ = conditions.Normalize(s.Conditions, isJobCondition, mnow)
	s.ObservedGeneration = job.Generation
	if s.StartTime == nil {
		s.StartTime = &mnow
	}
	wasFinished := finished(job.Status)

	b := sortWorkers(workers, p, now, wasFinished, &out)
	if b.failReason == "" {
		b.failReason, b.failMessage = jobFailure(b.charged, *s.StartTime, p, now, &out)
	}
	// Trainers exit 0 only when the aggregator tells them the training is over, so once every one has, an
	// aggregator can no longer help: a new one would wait for trainers that are gone.
	trainingEnded, trainingEndedAt := trainingEndedByTrainers(s.Workers)
	if trainingEnded && !b.aggregatorDone {
		out.create = withoutRole(out.create, v1alpha1.WorkerRoleAggregator)
	}
	var endedWithoutAggregator string
	if trainingEnded && !b.aggregatorDone && !wasFinished {
		endedWithoutAggregator = aggregatorOutlived(b.aggregatorActive, trainingEndedAt, now, &out)
	}

	switch {
	case wasFinished:
	case b.aggregatorDone || endedWithoutAggregator != "":
		message := "the aggregator finished successfully"
		if !b.aggregatorDone {
			message = endedWithoutAggregator
		}
		conditions.Set(&s.Conditions, metav1.Condition{Type: v1alpha1.FLConditionComplete, Status: metav1.ConditionTrue,
			Reason: ReasonCompleted, Message: message, ObservedGeneration: job.Generation}, mnow)
		s.CompletionTime = &mnow
		out.events = append(out.events, event{corev1.EventTypeNormal, ReasonCompleted, "Job completed"})
	case b.failReason != "":
		conditions.Set(&s.Conditions, metav1.Condition{Type: v1alpha1.FLConditionFailed, Status: metav1.ConditionTrue,
			Reason: b.failReason, Message: b.failMessage, ObservedGeneration: job.Generation}, mnow)
		out.events = append(out.events, event{corev1.EventTypeWarning, b.failReason, b.failMessage})
	}
	if finished(*s) {
		out.create, out.retryAt = nil, time.Time{}
		out.remove = append(out.remove, podsToStop(workers, *s, p)...)
		out.finish = endedUnmarked(workers)
	}

	s.Active, s.Succeeded, s.Failed = b.active, b.succeeded, b.charged
	s.Phase = jobPhase(*s, b.running)
	conditions.Set(&s.Conditions, trainingCondition(*s, b.running, job.Generation), mnow)
	return out
}

// endedUnmarked are the workers' pods that ended and are not yet marked with WorkloadFinishedAnnotation: a
// trainer's stand-in on a node that was cut off when its last failure ended the job would run on otherwise, for
// a pod no one will replace.
func endedUnmarked(workers []worker) []*corev1.Pod {
	var out []*corev1.Pod
	for _, w := range workers {
		if p := w.pod; p != nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) &&
			p.Annotations[lifelinev1.WorkloadFinishedAnnotation] == "" {
			out = append(out, p)
		}
	}
	return out
}

// buckets is what the workers of a pass come to.
type buckets struct {
	charged, active, succeeded int32 // failures and restarts; pods that run or wait to; workers that succeeded
	running                    bool  // a worker's pod runs
	aggregatorDone             bool  // the aggregator succeeded
	aggregatorActive           bool  // the aggregator's pod runs or waits to
	failReason, failMessage    string
}

// sortWorkers builds each worker's status record into out.status.Workers, and plans what its pod calls for: its
// end counted, a release, a removal to make room for a retry, a creation or a wait for one. It returns the counts.
func sortWorkers(workers []worker, p runPolicy, now time.Time, wasFinished bool, out *plan) buckets {
	var b buckets
	mnow := metav1.NewTime(now)
	s := &out.status
	s.Workers = s.Workers[:0:0]
	for _, w := range workers {
		rec := observeWorker(w, mnow)
		if w.pod != nil {
			pod := w.pod
			counted := w.record.CountedPodUID == pod.UID
			switch {
			case isTerminal(pod) && rec.CountedPodUID != pod.UID:
				out.events = append(out.events, countEnd(&rec, pod, mnow)...)
			case isTerminal(pod) && counted:
				if hasFinalizer(pod) {
					out.release = append(out.release, pod)
				}
				if pod.Status.Phase == corev1.PodFailed && pod.DeletionTimestamp == nil && !wasFinished {
					// The failed pod stays until its retry is due, then makes room for it (the retry has its
					// name): its logs stay readable meanwhile, and its node's agent sees the worker still wanted,
					// so a stand-in it runs is not handed back before the retry runs.
					if at := retryTime(rec, p); at.After(now) {
						waitRetry(&rec, out, at)
					} else {
						out.remove = append(out.remove, pod)
					}
				}
			case pod.DeletionTimestamp != nil:
				// Deleted while running (by a person, a drain, the node lifecycle): not the worker's failure.
				if hasFinalizer(pod) {
					out.release = append(out.release, pod)
				}
			default:
				b.active++
				b.running = b.running || pod.Status.Phase == corev1.PodRunning
				b.aggregatorActive = b.aggregatorActive || w.id.role == v1alpha1.WorkerRoleAggregator
			}
		}
		if rec.Phase == string(corev1.PodSucceeded) {
			b.succeeded++
			if w.id.role == v1alpha1.WorkerRoleAggregator {
				b.aggregatorDone = true
			}
		}
		if w.pod == nil && rec.Phase != string(corev1.PodSucceeded) && !wasFinished {
			rec.Phase = string(corev1.PodPending)
			if at := retryTime(rec, p); !at.After(now) {
				out.create = append(out.create, w.id)
			} else {
				waitRetry(&rec, out, at)
			}
		}
		spent := rec.Failures + rec.Restarts
		b.charged += spent
		if spent > p.backoffLimitPerWorker && b.failReason == "" {
			b.failReason = ReasonBackoffLimitExceeded
			b.failMessage = fmt.Sprintf("worker %s failed %d times, more than backoffLimitPerWorker %d", rec.Name, spent, p.backoffLimitPerWorker)
		}
		s.Workers = append(s.Workers, rec)
	}
	return b
}

// jobFailure tells why the job as a whole fails, if it does: its workers' failures past backoffLimit, or its
// deadline passed; a deadline still ahead is when the pass must run again.
func jobFailure(charged int32, started metav1.Time, p runPolicy, now time.Time, out *plan) (reason, message string) {
	if charged > p.backoffLimit {
		return ReasonBackoffLimitExceeded, fmt.Sprintf("workers failed %d times, more than backoffLimit %d", charged, p.backoffLimit)
	}
	if p.activeDeadline == nil {
		return "", ""
	}
	deadline := started.Add(*p.activeDeadline)
	if !now.Before(deadline) {
		return ReasonDeadlineExceeded, fmt.Sprintf("job ran longer than activeDeadlineSeconds (%s)", p.activeDeadline)
	}
	out.retryAt = earliest(out.retryAt, deadline)
	return "", ""
}

// aggregatorOutlived tells why the job completes without its aggregator once every trainer has finished: it
// ended without success, or ran past AggregatorGracePeriod; "" while the grace runs (the pass runs again at its
// end).
func aggregatorOutlived(aggregatorActive bool, trainingEndedAt, now time.Time, out *plan) string {
	graceEnd := trainingEndedAt.Add(AggregatorGracePeriod)
	switch {
	case !aggregatorActive:
		return "every trainer finished; the aggregator's pod ended without success after the training was over"
	case !now.Before(graceEnd):
		return fmt.Sprintf("every trainer finished; the aggregator did not end within %s and was stopped", AggregatorGracePeriod)
	}
	out.retryAt = earliest(out.retryAt, graceEnd)
	return ""
}

// trainingCondition is the Training condition a status calls for.
func trainingCondition(s v1alpha1.FederatedLearningJobStatus, running bool, generation int64) metav1.Condition {
	training := metav1.Condition{Type: v1alpha1.FLConditionTraining, ObservedGeneration: generation}
	switch {
	case finished(s):
		training.Status, training.Reason, training.Message = metav1.ConditionFalse, ReasonCompleted, "the job has finished"
		if c := findCondition(s.Conditions, v1alpha1.FLConditionFailed); c != nil && c.Status == metav1.ConditionTrue {
			training.Reason, training.Message = c.Reason, c.Message
		}
	case running:
		training.Status, training.Reason, training.Message = metav1.ConditionTrue, ReasonWorkersRunning, "workers are running"
	default:
		training.Status, training.Reason, training.Message = metav1.ConditionFalse, ReasonWaitingForWorkers, "no worker is running yet"
	}
	return training
}

// AggregatorGracePeriod is how long the aggregator may run on once every trainer has finished — writing the
// model, ending its rounds — before the job completes without it and stops it.
const AggregatorGracePeriod = time.Minute

// trainingEndedByTrainers tells whether every trainer has succeeded, and when the last of them was seen to.
func trainingEndedByTrainers(records []v1alpha1.WorkerStatus) (bool, time.Time) {
	var last time.Time
	trainers := 0
	for _, r := range records {
		if r.Role != v1alpha1.WorkerRoleTrainer {
			continue
		}
		trainers++
		if r.Phase != string(corev1.PodSucceeded) {
			return false, time.Time{}
		}
		if r.LastTransitionTime != nil && r.LastTransitionTime.After(last) {
			last = r.LastTransitionTime.Time
		}
	}
	return trainers > 0, last
}

func withoutRole(ids []identity, role v1alpha1.WorkerRole) []identity {
	var kept []identity
	for _, id := range ids {
		if id.role != role {
			kept = append(kept, id)
		}
	}
	return kept
}

// observeWorker refreshes an identity's record from its pod, keeping what the pod cannot tell (failures, the
// counted pod, transition times).
func observeWorker(w worker, now metav1.Time) v1alpha1.WorkerStatus {
	rec := w.record
	rec.Name, rec.Role = w.id.name, w.id.role
	if w.pod != nil {
		rec.Message = ""
		return edgeaware.Record(rec, w.pod, w.view, w.record, now)
	}
	if rec.Phase != string(corev1.PodSucceeded) {
		rec.Liveness, rec.Ready, rec.Restarts, rec.Source = v1alpha1.LivenessUnknown, false, 0, v1alpha1.StatusSourceNone
	}
	edgeaware.Transitioned(&rec, w.record, now)
	return rec
}

// countEnd records the end of a terminal pod in its identity's record: a success marks the identity done, a
// failure not caused by a disruption is charged, with the restarts it went through.
func countEnd(rec *v1alpha1.WorkerStatus, pod *corev1.Pod, now metav1.Time) []event {
	rec.CountedPodUID = pod.UID
	restarts := containerRestarts(pod)
	rec.Restarts = 0
	switch {
	case pod.Status.Phase == corev1.PodSucceeded:
		rec.Failures += restarts
		return nil
	case endedByDisruption(pod):
		rec.Failures += restarts
		rec.Message = "ended by a disruption (" + pod.Status.Reason + "); not counted"
		return []event{{corev1.EventTypeNormal, ReasonWorkerDisrupted, fmt.Sprintf("Worker %s was disrupted; re-creating it", pod.Name)}}
	default:
		rec.Failures += 1 + restarts
		// The API stores whole seconds; rounding up keeps a retry from coming early.
		failedAt := metav1.NewTime(now.Add(time.Second - 1).Truncate(time.Second))
		rec.LastFailureTime = &failedAt
		rec.Message = exitMessage(pod)
		return []event{{corev1.EventTypeWarning, ReasonWorkerFailed, fmt.Sprintf("Worker %s failed: %s", pod.Name, rec.Message)}}
	}
}

func exitMessage(pod *corev1.Pod) string {
	for _, c := range pod.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("container %s exited %d (%s)", c.Name, t.ExitCode, t.Reason)
		}
	}
	if pod.Status.Message != "" {
		return pod.Status.Message
	}
	return "pod failed"
}

// waitRetry says in the worker's record when its retry is due, and has the plan look again then.
func waitRetry(rec *v1alpha1.WorkerStatus, out *plan, at time.Time) {
	rec.Message = fmt.Sprintf("retrying after %s (failure %d)", at.UTC().Format(time.RFC3339), rec.Failures)
	out.retryAt = earliest(out.retryAt, at)
}

// retryTime is when a missing identity may be created: at once, unless its last charged failure asks for a
// backoff.
func retryTime(rec v1alpha1.WorkerStatus, p runPolicy) time.Time {
	if rec.LastFailureTime == nil {
		return time.Time{}
	}
	return rec.LastFailureTime.Add(p.retryDelay(rec.Failures))
}

// podsToStop are the active pods a finished job ends: every one after a failure; the trainers after success
// unless the policy lets them finish.
func podsToStop(workers []worker, s v1alpha1.FederatedLearningJobStatus, p runPolicy) []*corev1.Pod {
	failed := conditions.IsTrue(s.Conditions, v1alpha1.FLConditionFailed)
	if !failed && p.trainersOnCompletion == v1alpha1.TrainersWait {
		return nil
	}
	var stop []*corev1.Pod
	for _, w := range workers {
		if w.pod != nil && !isTerminal(w.pod) && w.pod.DeletionTimestamp == nil {
			stop = append(stop, w.pod)
		}
	}
	return stop
}

func jobPhase(s v1alpha1.FederatedLearningJobStatus, running bool) v1alpha1.FLJobPhase {
	switch {
	case conditions.IsTrue(s.Conditions, v1alpha1.FLConditionFailed):
		return v1alpha1.FLJobFailed
	case conditions.IsTrue(s.Conditions, v1alpha1.FLConditionComplete):
		return v1alpha1.FLJobSucceeded
	case running:
		return v1alpha1.FLJobRunning
	default:
		return v1alpha1.FLJobPending
	}
}

func hasFinalizer(pod *corev1.Pod) bool {
	for _, f := range pod.Finalizers {
		if f == WorkerFinalizer {
			return true
		}
	}
	return false
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}
