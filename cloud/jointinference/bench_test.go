package jointinference_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/test/cluster"
)

const recreations = 100

// BenchmarkChildRecreation measures how long a deleted child takes to come back: Lifeline re-creating a JI's edge
// Deployment, beside the anchor of kube-controller-manager's Deployment controller re-creating a deleted
// ReplicaSet, in the same run on the same control plane.
func BenchmarkChildRecreation(b *testing.B) {
	cluster.SkipIfShort(b)
	ji := createService(b, "helmet_detection_inference.yaml")
	waitUntilReadyForBench(b, ji.Namespace, ji.Name)
	lifeline := measureRecreation(b, ji.Namespace, "deployments", jointinference.DeploymentName(ji.Name, "edge"),
		func(ctx context.Context, name string) error {
			return kube.AppsV1().Deployments(ji.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		})

	anchorNS := ji.Namespace
	anchorDeployment(b, anchorNS)
	anchor := measureRecreation(b, anchorNS, "replicasets", "", func(ctx context.Context, _ string) error {
		rss, err := kube.AppsV1().ReplicaSets(anchorNS).List(ctx, metav1.ListOptions{LabelSelector: "app=anchor"})
		if err != nil || len(rss.Items) != 1 {
			return fmt.Errorf("anchor has %d ReplicaSets: %v", len(rss.Items), err)
		}
		return kube.AppsV1().ReplicaSets(anchorNS).Delete(ctx, rss.Items[0].Name, metav1.DeleteOptions{})
	})

	lp50, lp99 := percentile(lifeline, 50), percentile(lifeline, 99)
	ap50, ap99 := percentile(anchor, 50), percentile(anchor, 99)
	b.ReportMetric(float64(lp50.Milliseconds()), "lifeline-p50-ms")
	b.ReportMetric(float64(lp99.Milliseconds()), "lifeline-p99-ms")
	b.ReportMetric(float64(ap50.Milliseconds()), "anchor-p50-ms")
	b.ReportMetric(float64(ap99.Milliseconds()), "anchor-p99-ms")
	fmt.Printf("\nJI child re-creation over %d deletions (delete -> new object seen by a watch)\n", recreations)
	fmt.Printf("  %-44s p50 %8v  p99 %8v\n", "Lifeline: JI edge Deployment", lp50.Round(time.Microsecond), lp99.Round(time.Microsecond))
	fmt.Printf("  %-44s p50 %8v  p99 %8v\n", "anchor: Deployment controller, ReplicaSet", ap50.Round(time.Microsecond), ap99.Round(time.Microsecond))
	fmt.Printf("  ratio Lifeline/anchor: p50 %.2fx  p99 %.2fx\n", ratio(lp50, ap50), ratio(lp99, ap99))
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func waitUntilReadyForBench(b *testing.B, ns, name string) {
	deadline := time.Now().Add(readyWithin)
	for time.Now().Before(deadline) {
		d, err := kube.AppsV1().Deployments(ns).Get(context.Background(), jointinference.DeploymentName(name, "edge"), metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas == 1 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("service %s never became ready", name)
}

// anchorDeployment is a plain Deployment whose ReplicaSet the anchor deletes.
func anchorDeployment(b *testing.B, ns string) {
	labels := map[string]string{"app": "anchor"}
	_, err := kube.AppsV1().Deployments(ns).Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "anchor"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{NodeName: "cloud-node", Containers: []corev1.Container{{Name: "c", Image: "anchor:1"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(readyWithin)
	for time.Now().Before(deadline) {
		rss, err := kube.AppsV1().ReplicaSets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=anchor"})
		if err == nil && len(rss.Items) == 1 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatal("anchor ReplicaSet never appeared")
}

// measureRecreation deletes an object `recreations` times and times each deletion until a watch shows an object
// of that resource with a new UID (and, when name is set, that name).
func measureRecreation(b *testing.B, ns, resource, name string, del func(context.Context, string) error) []time.Duration {
	ctx := context.Background()
	var lat []time.Duration
	for i := 0; i < recreations; i++ {
		var w watch.Interface
		var err error
		var before types.UID
		switch resource {
		case "deployments":
			d, gerr := kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if gerr != nil {
				b.Fatal(gerr)
			}
			before = d.UID
			w, err = kube.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: d.ResourceVersion})
		case "replicasets":
			rss, lerr := kube.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=anchor"})
			if lerr != nil || len(rss.Items) != 1 {
				b.Fatalf("anchor ReplicaSets: %v", lerr)
			}
			before = rss.Items[0].UID
			w, err = kube.AppsV1().ReplicaSets(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app=anchor", ResourceVersion: rss.ResourceVersion})
		}
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := del(ctx, name); err != nil {
			b.Fatal(err)
		}
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case ev := <-w.ResultChan():
				obj, ok := ev.Object.(metav1.Object)
				if ev.Type == watch.Added && ok && obj.GetUID() != before && (name == "" || obj.GetName() == name) {
					lat = append(lat, time.Since(start))
					break wait
				}
			case <-timeout:
				b.Fatalf("deletion %d of %s: nothing re-created within 30s", i, resource)
			}
		}
		w.Stop()
		// Let the new object settle (its pods start) before the next deletion, as an operator's mistake would.
		time.Sleep(50 * time.Millisecond)
	}
	return lat
}

func percentile(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	idx := (len(s)*p + 99) / 100
	if idx > 0 {
		idx--
	}
	return s[idx]
}
