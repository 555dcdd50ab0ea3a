package contract

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestIndexWorkloadPodsKeysByTheKindsNameLabel(t *testing.T) {
	labels := Labels("FederatedLearningJob", "job-a", "u1", "train")
	labels["jointinferenceservice.sedna.io/name"] = "svc"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
	if got := IndexWorkloadPods("FederatedLearningJob")(pod); len(got) != 1 || got[0] != "job-a" {
		t.Errorf("FL index keys %v, want [job-a]", got)
	}
	if got := IndexWorkloadPods("JointInferenceService")(pod); len(got) != 1 || got[0] != "svc" {
		t.Errorf("JI index keys %v, want [svc]", got)
	}
	if got := IndexWorkloadPods("FederatedLearningJob")(&corev1.Pod{}); got != nil {
		t.Errorf("a pod without the label has keys %v", got)
	}
	mirror := pod.DeepCopy()
	mirror.Annotations = map[string]string{MirrorAnnotation: "8ca8cad6"}
	if got := IndexWorkloadPods("FederatedLearningJob")(mirror); got != nil {
		t.Errorf("a mirror pod (a node's stand-in for a worker, with its labels) indexed under %v", got)
	}
}
