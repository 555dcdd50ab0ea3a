package federatedlearning

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

func TestMatchSednaPods(t *testing.T) {
	job := &v1alpha1.FederatedLearningJob{ObjectMeta: metav1.ObjectMeta{Name: "fl", UID: "u"}}
	for _, tw := range []struct{ ds, node string }{{"d1", "edge1"}, {"d2", "edge2"}, {"d2", "edge3"}} {
		w := v1alpha1.TrainingWorker{Dataset: v1alpha1.DatasetRef{Name: tw.ds}}
		w.Template.Spec.NodeName = tw.node
		job.Spec.TrainingWorkers = append(job.Spec.TrainingWorkers, w)
	}
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	// GM's pods: GenerateName names, worker-type label, DATASET_NAME env.
	pod := func(name, workerType, dataset, node string, age int, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute)),
				Labels: map[string]string{"federatedlearningjob.sedna.io/worker-type": workerType}},
			Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Env: []corev1.EnvVar{{Name: "DATASET_NAME", Value: dataset}}}}},
			Status: corev1.PodStatus{Phase: phase},
		}
	}
	all := map[string]bool{"fl-aggworker": true, "fl-trainworker-0": true, "fl-trainworker-1": true, "fl-trainworker-2": true}
	tests := []struct {
		name string
		free map[string]bool
		pods []*corev1.Pod
		want map[string]string // identity → pod name
	}{{
		name: "one pod per identity, trainers of one Dataset told apart by node",
		free: all,
		pods: []*corev1.Pod{pod("fl-train-c", "train", "d2", "edge3", 0, corev1.PodRunning), pod("fl-aggregation-a", "aggregation", "", "cloud", 0, corev1.PodRunning),
			pod("fl-train-b", "train", "d2", "edge2", 0, corev1.PodRunning), pod("fl-train-x", "train", "d1", "edge1", 0, corev1.PodRunning)},
		want: map[string]string{"fl-aggworker": "fl-aggregation-a", "fl-trainworker-0": "fl-train-x", "fl-trainworker-1": "fl-train-b", "fl-trainworker-2": "fl-train-c"},
	}, {
		name: "an identity that has a pod takes none",
		free: map[string]bool{"fl-trainworker-0": true},
		pods: []*corev1.Pod{pod("fl-aggregation-a", "aggregation", "", "cloud", 0, corev1.PodRunning), pod("fl-train-x", "train", "d1", "edge1", 0, corev1.PodRunning)},
		want: map[string]string{"fl-trainworker-0": "fl-train-x"},
	}, {
		name: "of two pods for one identity, the active one, then the newest",
		free: all,
		pods: []*corev1.Pod{pod("fl-aggregation-old", "aggregation", "", "cloud", 0, corev1.PodRunning), pod("fl-aggregation-failed", "aggregation", "", "cloud", 9, corev1.PodFailed),
			pod("fl-aggregation-new", "aggregation", "", "cloud", 5, corev1.PodRunning)},
		want: map[string]string{"fl-aggworker": "fl-aggregation-new"},
	}, {
		name: "a trainer on another node still takes its Dataset's free identity; an unknown Dataset matches nothing",
		free: all,
		pods: []*corev1.Pod{pod("fl-train-y", "train", "d1", "elsewhere", 0, corev1.PodRunning), pod("fl-train-z", "train", "d9", "edge1", 0, corev1.PodRunning)},
		want: map[string]string{"fl-trainworker-0": "fl-train-y"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]string{}
			for id, p := range matchSednaPods(job, tt.free, tt.pods) {
				got[id] = p.Name
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("matchSednaPods (-want +got):\n%s", diff)
			}
		})
	}
}
