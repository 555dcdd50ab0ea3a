package federatedlearning_test

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/test/harness"
)

const recreations = 100

// BenchmarkTrainerRecreation measures delete-to-replacement of an FL trainer (same name, same WORKER_NAME),
// beside the anchor of kube-controller-manager's StatefulSet controller re-creating its deleted pod-0, in the
// same run. Both old pods are finished by the same fake kubelet.
func BenchmarkTrainerRecreation(b *testing.B) {
	harness.SkipIfShort(b)
	job := startJob(b, "federated-learning.yaml", nil)
	trainer := fl.TrainerName(job.Name, 0)
	lifeline := harness.MeasureRecreations(b, recreations, namedPod(job.Namespace, trainer))

	createAnchorStatefulSet(b, job.Namespace)
	anchor := harness.MeasureRecreations(b, recreations, namedPod(job.Namespace, "anchor-0"))
	harness.ReportComparison(b, "FL trainer re-creation (delete -> same-name replacement seen by a watch)",
		"FL trainer pod", lifeline, "StatefulSet controller, pod-0", anchor)
}

// namedPod deletes a pod by name and waits for a pod of the same name with another UID.
func namedPod(ns, name string) harness.Recreatable {
	pods := env.Kube.CoreV1().Pods(ns)
	return harness.Recreatable{
		Name: name,
		Current: func(ctx context.Context) (types.UID, string, error) {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", "", err
			}
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				return "", "", errNotRunning
			}
			return p.UID, p.ResourceVersion, nil
		},
		Watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
				ResourceVersion: rv})
		},
		Delete: func(ctx context.Context) error { return pods.Delete(ctx, name, metav1.DeleteOptions{}) },
	}
}

var errNotRunning = errors.New("pod not running yet")

func createAnchorStatefulSet(b *testing.B, ns string) {
	labels := map[string]string{"app": "anchor"}
	_, err := env.Kube.AppsV1().StatefulSets(ns).Create(context.Background(), &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "anchor"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{NodeName: "edge1", Containers: []corev1.Container{{Name: "c", Image: "anchor:1"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
}
