package federatedlearning

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func testJob(records ...v1alpha1.WorkerStatus) *v1alpha1.FederatedLearningJob {
	j := &v1alpha1.FederatedLearningJob{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", UID: "job-uid", Generation: 1}}
	j.Spec.TrainingWorkers = make([]v1alpha1.TrainingWorker, 1)
	start := metav1.NewTime(t0.Add(-time.Minute))
	j.Status.StartTime = &start
	j.Status.Workers = records
	return j
}

func pod(name string, uid types.UID, phase corev1.PodPhase, restarts int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, Finalizers: []string{WorkerFinalizer}},
		Status:     corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: "c", RestartCount: restarts}}},
	}
}

func workersOf(job *v1alpha1.FederatedLearningJob, pods map[string]*corev1.Pod) []worker {
	recs := map[string]v1alpha1.WorkerStatus{}
	for _, r := range job.Status.Workers {
		recs[r.Name] = r
	}
	var ws []worker
	for _, id := range identities(job) {
		ws = append(ws, worker{id: id, pod: pods[id.name], record: recs[id.name]})
	}
	return ws
}

func record(p plan, name string) v1alpha1.WorkerStatus {
	for _, w := range p.status.Workers {
		if w.Name == name {
			return w
		}
	}
	return v1alpha1.WorkerStatus{}
}

func withTransition(r v1alpha1.WorkerStatus, at time.Time) v1alpha1.WorkerStatus {
	t := metav1.NewTime(at)
	r.LastTransitionTime = &t
	return r
}

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func TestDecide(t *testing.T) {
	agg, tr := "j-aggworker", "j-trainworker-0"
	failedAt := metav1.NewTime(t0.Add(-5 * time.Second))
	longAgo := metav1.NewTime(t0.Add(-time.Hour))
	trainerDoneAt := metav1.NewTime(t0.Add(-10 * time.Second))
	trainerDone := v1alpha1.WorkerStatus{Name: tr, Role: v1alpha1.WorkerRoleTrainer, Phase: "Succeeded",
		CountedPodUID: "t1", LastTransitionTime: &trainerDoneAt}
	cases := []struct {
		name   string
		job    *v1alpha1.FederatedLearningJob
		pods   map[string]*corev1.Pod
		policy runPolicy
		check  func(t *testing.T, p plan)
	}{{
		name: "new job creates every worker",
		job:  testJob(),
		check: func(t *testing.T, p plan) {
			if len(p.create) != 2 || p.status.Phase != v1alpha1.FLJobPending {
				t.Errorf("create %v phase %s", p.create, p.status.Phase)
			}
		},
	}, {
		name: "a failure is counted once, with its restarts, and not yet released",
		job:  testJob(),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0), tr: pod(tr, "t1", corev1.PodFailed, 2)},
		check: func(t *testing.T, p plan) {
			r := record(p, tr)
			if r.Failures != 3 || r.CountedPodUID != "t1" || r.LastFailureTime == nil {
				t.Errorf("record %+v, want 3 failures counted for t1", r)
			}
			if len(p.release) != 0 || len(p.remove) != 0 {
				t.Errorf("released %v removed %v before the count was stored", names(p.release), names(p.remove))
			}
		},
	}, {
		name: "a stored failure releases the pod and keeps it until its retry is due",
		job:  testJob(v1alpha1.WorkerStatus{Name: tr, Failures: 1, CountedPodUID: "t1", LastFailureTime: &failedAt}),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0), tr: pod(tr, "t1", corev1.PodFailed, 0)},
		check: func(t *testing.T, p plan) {
			if r := record(p, tr); r.Failures != 1 || !strings.HasPrefix(r.Message, "retrying after") {
				t.Errorf("record %+v, want counted once and its retry said", r)
			}
			if got := names(p.release); len(got) != 1 || got[0] != tr {
				t.Errorf("release %v", got)
			}
			if len(p.remove) != 0 || !p.retryAt.Equal(failedAt.Add(10*time.Second)) {
				t.Errorf("remove %v retryAt %v, want the failed pod kept until its retry 10s after the failure", names(p.remove), p.retryAt)
			}
		},
	}, {
		name: "a stored failure whose retry is due makes room for it",
		job:  testJob(v1alpha1.WorkerStatus{Name: tr, Failures: 1, CountedPodUID: "t1", LastFailureTime: &longAgo}),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0), tr: pod(tr, "t1", corev1.PodFailed, 0)},
		check: func(t *testing.T, p plan) {
			if got := names(p.remove); len(got) != 1 || got[0] != tr {
				t.Errorf("remove %v", got)
			}
		},
	}, {
		name:   "a missing worker waits for its backoff",
		job:    testJob(v1alpha1.WorkerStatus{Name: tr, Failures: 2, CountedPodUID: "t1", LastFailureTime: &failedAt}),
		pods:   map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0)},
		policy: runPolicy{backoffLimit: 6, backoffLimitPerWorker: 3, backoff: 10 * time.Second, maxBackoff: time.Minute},
		check: func(t *testing.T, p plan) {
			if len(p.create) != 0 || !p.retryAt.Equal(failedAt.Add(20*time.Second)) {
				t.Errorf("create %v retryAt %v, want a retry 20s after the failure", p.create, p.retryAt)
			}
		},
	}, {
		name: "container restarts of a running pod are charged to the budget",
		job:  testJob(),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0), tr: pod(tr, "t1", corev1.PodRunning, 4)},
		check: func(t *testing.T, p plan) {
			if p.status.Phase != v1alpha1.FLJobFailed || p.status.Failed != 4 {
				t.Errorf("phase %s failed %d, want Failed after 4 restarts (limit 3)", p.status.Phase, p.status.Failed)
			}
			if got := names(p.remove); len(got) != 2 {
				t.Errorf("a failed job stops its workers; removed %v", got)
			}
		},
	}, {
		name: "a deleted running pod is let go without charge",
		job:  testJob(),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0), tr: func() *corev1.Pod {
			p := pod(tr, "t1", corev1.PodRunning, 0)
			now := metav1.NewTime(t0)
			p.DeletionTimestamp = &now
			return p
		}()},
		check: func(t *testing.T, p plan) {
			if got := names(p.release); len(got) != 1 || record(p, tr).Failures != 0 {
				t.Errorf("release %v failures %d", got, record(p, tr).Failures)
			}
		},
	}, {
		name: "a job failed by its trainer's failures marks the trainer's ended pod, once",
		job:  testJob(v1alpha1.WorkerStatus{Name: tr, Failures: 3, CountedPodUID: "t0", LastFailureTime: &failedAt}),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0), tr: pod(tr, "t1", corev1.PodFailed, 0)},
		check: func(t *testing.T, p plan) {
			if !finished(p.status) {
				t.Fatalf("conditions %v: want the job failed by its trainer's fourth failure", p.status.Conditions)
			}
			if got := names(p.finish); len(got) != 1 || got[0] != tr {
				t.Errorf("marked finished %v, want the failed trainer alone (the running aggregator is stopped)", got)
			}
			marked := pod(tr, "t1", corev1.PodFailed, 0)
			marked.Annotations = map[string]string{lifelinev1.WorkloadFinishedAnnotation: "true"}
			if again := endedUnmarked([]worker{{pod: marked}}); len(again) != 0 {
				t.Errorf("a marked pod marked again: %v", names(again))
			}
		},
	}, {
		name: "a succeeded aggregator completes the job and stops the trainers",
		job:  testJob(v1alpha1.WorkerStatus{Name: agg, Phase: "Running"}),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodSucceeded, 0), tr: pod(tr, "t1", corev1.PodRunning, 0)},
		check: func(t *testing.T, p plan) {
			if p.status.Phase != v1alpha1.FLJobSucceeded || p.status.CompletionTime == nil {
				t.Errorf("phase %s completion %v", p.status.Phase, p.status.CompletionTime)
			}
			if got := names(p.remove); len(got) != 1 || got[0] != tr {
				t.Errorf("remove %v, want the running trainer", got)
			}
		},
	}, {
		name: "a succeeded identity is never created again",
		job:  testJob(v1alpha1.WorkerStatus{Name: tr, Phase: "Succeeded", CountedPodUID: "t1"}),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a1", corev1.PodRunning, 0)},
		check: func(t *testing.T, p plan) {
			for _, id := range p.create {
				if id.name == tr {
					t.Errorf("re-creating a succeeded trainer")
				}
			}
		},
	}, {
		name: "every trainer finished and the aggregator's pod was lost: the job completes, nothing is rebuilt",
		job:  testJob(v1alpha1.WorkerStatus{Name: agg, Role: v1alpha1.WorkerRoleAggregator, Phase: "Running"}, trainerDone),
		check: func(t *testing.T, p plan) {
			if p.status.Phase != v1alpha1.FLJobSucceeded || len(p.create) != 0 {
				t.Errorf("phase %s create %v, want Succeeded and nothing created", p.status.Phase, p.create)
			}
		},
	}, {
		name: "every trainer finished and the aggregator runs: it has the grace period to end",
		job:  testJob(v1alpha1.WorkerStatus{Name: agg, Role: v1alpha1.WorkerRoleAggregator, Phase: "Running"}, trainerDone),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a2", corev1.PodRunning, 0)},
		check: func(t *testing.T, p plan) {
			if finished(p.status) || len(p.remove) != 0 {
				t.Errorf("finished %v remove %v within the grace period", finished(p.status), names(p.remove))
			}
			if want := trainerDoneAt.Add(AggregatorGracePeriod); !p.retryAt.Equal(want) {
				t.Errorf("retry at %v, want the grace period's end %v", p.retryAt, want)
			}
		},
	}, {
		name: "every trainer finished long ago and the aggregator still runs: the job completes and stops it",
		job: testJob(v1alpha1.WorkerStatus{Name: agg, Role: v1alpha1.WorkerRoleAggregator, Phase: "Running"},
			withTransition(trainerDone, t0.Add(-AggregatorGracePeriod))),
		pods: map[string]*corev1.Pod{agg: pod(agg, "a2", corev1.PodRunning, 0)},
		check: func(t *testing.T, p plan) {
			if p.status.Phase != v1alpha1.FLJobSucceeded {
				t.Errorf("phase %s, want Succeeded", p.status.Phase)
			}
			if got := names(p.remove); len(got) != 1 || got[0] != agg {
				t.Errorf("remove %v, want the aggregator", got)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pol := tc.policy
			if pol.backoff == 0 {
				pol = effectivePolicy(tc.job)
			}
			tc.check(t, decide(tc.job, workersOf(tc.job, tc.pods), pol, t0))
		})
	}
}
