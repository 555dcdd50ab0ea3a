package jointinference_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/harness"
)

const readinessFlips = 20

// BenchmarkStatusFollowsNodeReadiness measures how long a worker's status record takes to follow its Node's Ready
// condition (flipped by the test: the source turns none <-> apiserver), beside the anchor of the same record
// following its pod's Ready condition, through the pod watch, in the same run on the same control plane.
func BenchmarkStatusFollowsNodeReadiness(b *testing.B) {
	harness.SkipIfShort(b)
	runEdgeAware(b)
	ns := env.NewNamespace(b, "ji")
	node := "flip-" + ns
	env.AddNode(b, node, corev1.ConditionTrue)
	ji := createServiceOn(b, ns, node)
	pod := env.ReportRunning(b, edgePod(b, ns))
	waitWorkerRecord(b, ji, pod.Name, "the edge worker Alive", func(w v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive && w.Ready
	})
	watcher, err := client.NewWithWatch(env.ControlPlane.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	measure := func(change func(), ok func(v1alpha1.WorkerStatus) bool) time.Duration {
		return timeUntilRecord(b, watcher, ji, pod.Name, change, ok)
	}

	var nodeLat []time.Duration
	for i := range readinessFlips {
		ready, want := corev1.ConditionFalse, v1alpha1.StatusSourceNone
		if i%2 == 1 {
			ready, want = corev1.ConditionTrue, v1alpha1.StatusSourceAPIServer
		}
		nodeLat = append(nodeLat, measure(func() { env.SetNodeReadiness(b, node, ready) },
			func(w v1alpha1.WorkerStatus) bool { return w.Source == want }))
	}
	var podLat []time.Duration
	for i := range readinessFlips {
		ready := i%2 == 1
		podLat = append(podLat, measure(func() { setPodReady(b, pod, ready) },
			func(w v1alpha1.WorkerStatus) bool { return w.Ready == ready }))
	}
	harness.ReportComparison(b, "JI status following readiness (change -> record seen by a watch)",
		"Node Ready flipped", nodeLat, "pod Ready flipped", podLat)
}

// timeUntilRecord runs change and times it until a watch shows the service's record of pod satisfying ok.
func timeUntilRecord(b *testing.B, watcher client.WithWatch, ji *v1alpha1.JointInferenceService, pod string, change func(),
	ok func(v1alpha1.WorkerStatus) bool) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list := &v1alpha1.JointInferenceServiceList{}
	if err := env.Client.List(ctx, list, client.InNamespace(ji.Namespace)); err != nil {
		b.Fatal(err)
	}
	w, err := watcher.Watch(ctx, list, client.InNamespace(ji.Namespace),
		&client.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", ji.Name), Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	change()
	for ev := range w.ResultChan() {
		got, isJI := ev.Object.(*v1alpha1.JointInferenceService)
		if ev.Type != watch.Modified || !isJI {
			continue
		}
		for _, r := range got.Status.Workers {
			if r.Name == pod && ok(r) {
				return time.Since(start)
			}
		}
	}
	b.Fatalf("the record of %s did not follow within 30s", pod)
	return 0
}

// setPodReady posts the pod's Ready condition, as its kubelet would when a readiness probe turns.
func setPodReady(b *testing.B, pod *corev1.Pod, ready bool) {
	b.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &corev1.Pod{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
				p.Status.Conditions[i].Status, p.Status.Conditions[i].LastTransitionTime = status, metav1.Now()
			}
		}
		return env.Client.Status().Update(context.Background(), p)
	})
	if err != nil {
		b.Fatal(err)
	}
}
