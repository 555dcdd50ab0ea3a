package edgeaware

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

func TestRecord(t *testing.T) {
	ready := metav1.NewTime(time.Unix(1000, 0))
	running := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "edge-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: ready}},
		ContainerStatuses: []corev1.ContainerStatus{{RestartCount: 1}, {RestartCount: 1}}}}
	seen := time.Unix(2000, 0)
	before := metav1.NewTime(time.Unix(500, 0))
	now := metav1.NewTime(time.Unix(3000, 0))
	alive := v1alpha1.WorkerStatus{Name: "w", Phase: "Running", Liveness: v1alpha1.LivenessAlive, LastTransitionTime: &before}
	for _, tc := range []struct {
		name string
		view liveness.View
		old  v1alpha1.WorkerStatus
		want v1alpha1.WorkerStatus
	}{
		{"the API server's word, unchanged: the transition time stays", liveness.View{Truth: liveness.TruthAPIServer}, alive,
			v1alpha1.WorkerStatus{Name: "w", Node: "edge-1", Phase: "Running", Liveness: v1alpha1.LivenessAlive, Ready: true, Restarts: 2,
				Source: v1alpha1.StatusSourceAPIServer, LastSeen: &ready, LastTransitionTime: &before}},
		{"the agent's word: its phase, the higher restarts, when it was heard",
			liveness.View{Truth: liveness.TruthAgent, SeenAt: seen, State: &lifelinev1.WorkerState{Phase: lifelinev1.Phase_PHASE_FAILED, Restarts: 3}}, alive,
			v1alpha1.WorkerStatus{Name: "w", Node: "edge-1", Phase: "Failed", Liveness: v1alpha1.LivenessDead, Restarts: 3,
				Source: v1alpha1.StatusSourceAgent, LastSeen: ptr.To(metav1.NewTime(seen)), LastTransitionTime: &now}},
		{"the agent's word that the pod is gone", liveness.View{Truth: liveness.TruthAgent, SeenAt: seen,
			State: &lifelinev1.WorkerState{Phase: lifelinev1.Phase_PHASE_GONE}}, alive,
			v1alpha1.WorkerStatus{Name: "w", Node: "edge-1", Phase: "Gone", Liveness: v1alpha1.LivenessDead, Restarts: 2,
				Source: v1alpha1.StatusSourceAgent, LastSeen: ptr.To(metav1.NewTime(seen)), LastTransitionTime: &now}},
		{"no one's word: unknown, not ready", liveness.View{Truth: liveness.TruthUnknown}, alive,
			v1alpha1.WorkerStatus{Name: "w", Node: "edge-1", Phase: "Running", Liveness: v1alpha1.LivenessUnknown, Restarts: 2,
				Source: v1alpha1.StatusSourceNone, LastSeen: &ready, LastTransitionTime: &now}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Record(v1alpha1.WorkerStatus{Name: "w"}, running, tc.view, tc.old, now)
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("record\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}
