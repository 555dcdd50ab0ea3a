package jointinference

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

func workerPod(name string, phase corev1.PodPhase, ready bool) corev1.Pod {
	readiness := corev1.ConditionFalse
	if ready {
		readiness = corev1.ConditionTrue
	}
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: "edge1"},
		Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: readiness}}}}
}

// TestWorkerRecordsAreBoundedTroubledFirst: an HPA that scales a worker to hundreds of pods must not grow the
// status past what the API server stores; the records kept are first those that need attention, and the counts
// still count every pod.
func TestWorkerRecordsAreBoundedTroubledFirst(t *testing.T) {
	cases := []struct {
		name          string
		healthy, sick int
		wantRecords   int
	}{
		{"a few pods: every record", 3, 2, 5},
		{"exactly the bound", v1alpha1.MaxStatusWorkers - 1, 1, v1alpha1.MaxStatusWorkers},
		{"past the bound: the failed ones all kept", 400, 20, v1alpha1.MaxStatusWorkers},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			edge := workerObservation{workerType: workerEdge, deployment: &appsv1.Deployment{
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(tc.healthy + tc.sick))}}}
			for i := range tc.healthy {
				edge.pods = append(edge.pods, workerPod(fmt.Sprintf("edge-%04d", i), corev1.PodRunning, true))
			}
			// Named to sort last, so a bound that kept the first names would lose them.
			for i := range tc.sick {
				edge.pods = append(edge.pods, workerPod(fmt.Sprintf("zz-failed-%04d", i), corev1.PodFailed, false))
			}
			ji := &v1alpha1.JointInferenceService{}
			s, _ := computeStatus(ji, []workerObservation{{workerType: workerCloud}, edge}, nil, nil, metav1.NewTime(time.Unix(0, 0)))
			if len(s.Workers) != tc.wantRecords {
				t.Errorf("%d worker records, want %d", len(s.Workers), tc.wantRecords)
			}
			failed := 0
			for i, w := range s.Workers {
				if w.Liveness == v1alpha1.LivenessDead {
					failed++
				}
				if i > 0 && s.Workers[i-1].Name >= w.Name {
					t.Errorf("records not sorted by name: %s before %s", s.Workers[i-1].Name, w.Name)
				}
			}
			if failed != tc.sick {
				t.Errorf("%d failed workers among the records, want all %d", failed, tc.sick)
			}
			if s.Active != int32(tc.healthy) {
				t.Errorf("active = %d, want %d: counts are of every pod", s.Active, tc.healthy)
			}
		})
	}
}
