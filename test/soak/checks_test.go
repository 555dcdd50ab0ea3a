package soak

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

var allowViolation = cmp.AllowUnexported(violation{})

// runs is a set of running processes, each given as node, pod, container.
func runs(ps ...[3]string) map[process]bool {
	m := map[process]bool{}
	for _, p := range ps {
		m[process{p[0], p[1], p[2]}] = true
	}
	return m
}

func TestDuplicates(t *testing.T) {
	trainer := map[string][]string{"soak-1-trainer-0": {"trainer"}}
	twoContainers := map[string][]string{"soak-1-agg": {"aggregator", "sidecar"}}
	cases := []struct {
		name       string
		identities map[string][]string
		running    map[process]bool
		prev       map[string]bool
		counted    map[string]bool
		wantTwice  map[string]bool
		want       []violation
	}{{
		name:       "each worker runs once, on its node",
		identities: map[string][]string{"soak-1-trainer-0": {"trainer"}, "soak-1-trainer-1": {"trainer"}},
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}, [3]string{"edge2", "soak-1-trainer-1", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-0": true},
		wantTwice:  map[string]bool{},
	}, {
		name:       "its static pod, once handed back and stopped",
		identities: trainer,
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-0": true},
		wantTwice:  map[string]bool{},
	}, {
		name:       "nothing runs",
		identities: trainer,
		running:    runs(),
		wantTwice:  map[string]bool{},
	}, {
		name:       "two containers of one pod are one instance",
		identities: twoContainers,
		running:    runs([3]string{"cloud", "soak-1-agg", "aggregator"}, [3]string{"cloud", "soak-1-agg", "sidecar"}),
		prev:       map[string]bool{"soak-1-agg": true},
		wantTwice:  map[string]bool{},
	}, {
		name:       "a process of a pod that is no identity's",
		identities: trainer,
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}, [3]string{"edge2", "other", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-0": true},
		wantTwice:  map[string]bool{},
	}, {
		name:       "its pod on two nodes, at two checks",
		identities: trainer,
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}, [3]string{"edge2", "soak-1-trainer-0", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-0": true},
		wantTwice:  map[string]bool{"soak-1-trainer-0": true},
		want:       []violation{{duplicate, "soak-1-trainer-0"}},
	}, {
		name:       "its pod and a static pod on another node, at two checks",
		identities: trainer,
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}, [3]string{"edge2", "soak-1-trainer-0-edge2", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-0": true},
		wantTwice:  map[string]bool{"soak-1-trainer-0": true},
		want:       []violation{{duplicate, "soak-1-trainer-0"}},
	}, {
		name:       "its pod and a static pod on the same node, at two checks",
		identities: twoContainers,
		running:    runs([3]string{"edge1", "soak-1-agg", "sidecar"}, [3]string{"edge1", "soak-1-agg-edge1", "aggregator"}),
		prev:       map[string]bool{"soak-1-agg": true},
		wantTwice:  map[string]bool{"soak-1-agg": true},
		want:       []violation{{duplicate, "soak-1-agg"}},
	}, {
		name:       "twice for the first time: a handed back static pod may still be stopping",
		identities: trainer,
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}, [3]string{"edge1", "soak-1-trainer-0-edge1", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-1": true},
		wantTwice:  map[string]bool{"soak-1-trainer-0": true},
	}, {
		name:       "twice again, already counted",
		identities: trainer,
		running:    runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}, [3]string{"edge2", "soak-1-trainer-0", "trainer"}),
		prev:       map[string]bool{"soak-1-trainer-0": true},
		counted:    map[string]bool{"soak-1-trainer-0": true},
		wantTwice:  map[string]bool{"soak-1-trainer-0": true},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			twice, got := duplicates(tc.identities, tc.running, nodes, tc.prev, tc.counted)
			if diff := cmp.Diff(tc.wantTwice, twice); diff != "" {
				t.Errorf("running twice (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got, allowViolation); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOrphans(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	deleted := func(ago time.Duration) map[string]deletedJob {
		return map[string]deletedJob{"soak-1": {at: now.Add(-ago), workers: map[string][]string{
			"soak-1-aggregator": {"aggregator"}, "soak-1-trainer-0": {"trainer"}}}}
	}
	pod := func(job, name string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{jobLabel: job}}}
	}
	cases := []struct {
		name           string
		deleted        map[string]deletedJob
		pods           []corev1.Pod
		running        map[process]bool
		settled, final bool
		wantGone       []string
		want           []violation
	}{{
		name:     "every worker stopped and every pod removed",
		deleted:  deleted(10 * time.Second),
		settled:  true,
		wantGone: []string{"soak-1"},
	}, {
		name:     "only the next job's pods are left",
		deleted:  deleted(2 * time.Minute),
		pods:     []corev1.Pod{pod("soak-2", "soak-2-trainer-0")},
		running:  runs([3]string{"edge1", "soak-2-trainer-0", "trainer"}),
		settled:  true,
		wantGone: []string{"soak-1"},
	}, {
		name:    "a pod left, within the grace",
		deleted: deleted(30 * time.Second),
		pods:    []corev1.Pod{pod("soak-1", "soak-1-trainer-0")},
		settled: true,
	}, {
		name:    "a pod left past the grace, while a node cannot hear of the deletion",
		deleted: deleted(5 * time.Minute),
		pods:    []corev1.Pod{pod("soak-1", "soak-1-trainer-0")},
	}, {
		name:    "a pod left past the grace",
		deleted: deleted(2 * time.Minute),
		pods:    []corev1.Pod{pod("soak-1", "soak-1-trainer-0")},
		settled: true,
		want:    []violation{{orphan, "soak-1"}},
	}, {
		name:    "a worker still runs past the grace, its pod removed",
		deleted: deleted(2 * time.Minute),
		running: runs([3]string{"cloud", "soak-1-aggregator", "aggregator"}),
		settled: true,
		want:    []violation{{orphan, "soak-1"}},
	}, {
		name:    "a static pod standing in for a worker still runs past the grace",
		deleted: deleted(2 * time.Minute),
		running: runs([3]string{"edge2", "soak-1-trainer-0-edge2", "trainer"}),
		settled: true,
		want:    []violation{{orphan, "soak-1"}},
	}, {
		name:    "a worker still runs when the run has settled for good",
		deleted: deleted(5 * time.Second),
		running: runs([3]string{"edge1", "soak-1-trainer-0", "trainer"}),
		final:   true,
		want:    []violation{{orphan, "soak-1"}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gone, got := orphans(tc.deleted, tc.pods, tc.running, nodes, now, tc.settled, tc.final)
			if diff := cmp.Diff(tc.wantGone, gone); diff != "" {
				t.Errorf("gone (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got, allowViolation); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

func flJob(name string, phase v1alpha1.FLJobPhase, failed bool, round int32) *v1alpha1.FederatedLearningJob {
	j := &v1alpha1.FederatedLearningJob{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	j.Status.Phase = phase
	if failed {
		j.Status.Conditions = []metav1.Condition{{Type: v1alpha1.FLConditionFailed, Status: metav1.ConditionTrue, Reason: "BackoffLimitExceeded"}}
	}
	if round > 0 {
		j.Status.Progress = &v1alpha1.TrainingProgress{Round: round}
	}
	return j
}

func TestLostReports(t *testing.T) {
	cases := []struct {
		name string
		job  *v1alpha1.FederatedLearningJob
		want []violation
	}{
		{"succeeded with the last round", flJob("soak-1", v1alpha1.FLJobSucceeded, false, exitRound), nil},
		{"failed before the last round", flJob("soak-1", v1alpha1.FLJobFailed, true, 1), nil},
		{"still running", flJob("soak-1", v1alpha1.FLJobRunning, false, 2), nil},
		{"succeeded short of the last round", flJob("soak-1", v1alpha1.FLJobSucceeded, false, exitRound-1), []violation{{lostReport, "soak-1"}}},
		{"succeeded without any progress", flJob("soak-1", v1alpha1.FLJobSucceeded, false, 0), []violation{{lostReport, "soak-1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, lostReports(tc.job), allowViolation); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUnendedJobs(t *testing.T) {
	cases := []struct {
		name string
		job  *v1alpha1.FederatedLearningJob
		want []violation
	}{
		{"succeeded", flJob("soak-1", v1alpha1.FLJobSucceeded, false, exitRound), nil},
		{"failed", flJob("soak-1", v1alpha1.FLJobFailed, true, 1), nil},
		{"failed condition before the phase", flJob("soak-1", v1alpha1.FLJobRunning, true, 1), nil},
		{"still running", flJob("soak-1", v1alpha1.FLJobRunning, false, 2), []violation{{unended, "soak-1"}}},
		{"never had a status", flJob("soak-1", "", false, 0), []violation{{unended, "soak-1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, unendedJobs(tc.job), allowViolation); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestViolationMessages(t *testing.T) {
	for _, tc := range []struct {
		v    violation
		want string
	}{
		{violation{duplicate, "soak-1-trainer-0"}, "soak-1-trainer-0 runs twice"},
		{violation{orphan, "soak-1"}, "workers of the deleted job soak-1 still run or exist"},
		{violation{lostReport, "soak-1"}, "job soak-1 succeeded without its trainers' reports of round 3"},
		{violation{unended, "soak-1"}, "job soak-1 did not end"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.v.kind, got, tc.want)
		}
	}
}
