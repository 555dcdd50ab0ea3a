package manager_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

func namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := kube.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// createJI creates the shared helmet-detection JI in ns, with its Models, under name and labels.
func createJI(t *testing.T, ns, name string, lbls map[string]string) *v1alpha1.JointInferenceService {
	t.Helper()
	ji := &v1alpha1.JointInferenceService{}
	if err := testkit.LoadObject("joint-inference.yaml", testkit.DefaultVars, ji); err != nil {
		t.Fatal(err)
	}
	ji.Namespace, ji.Name, ji.Labels = ns, name, lbls
	for _, m := range []string{ji.Spec.EdgeWorker.Model.Name, ji.Spec.CloudWorker.Model.Name} {
		model := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m}, Spec: v1alpha1.ModelSpec{URL: "/models/" + m, Format: "pb"}}
		if err := kube.Create(context.Background(), model); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	if err := kube.Create(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	return ji
}

func deployments(t *testing.T, ns string) int {
	t.Helper()
	list := &appsv1.DeploymentList{}
	if err := kube.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// TestScopeLeavesOtherWorkloadsAlone: with --namespaces and --selector, Lifeline reconciles the selected
// workloads of its namespaces, and a Sedna installation's — in another namespace, or unlabelled — are not
// touched: no children, no status.
func TestScopeLeavesOtherWorkloadsAlone(t *testing.T) {
	harness.SkipIfShort(t)
	mine, other := namespace(t, "lifeline"), namespace(t, "sedna")
	sel, err := labels.Parse("lifeline.sedna.io/managed=true")
	if err != nil {
		t.Fatal(err)
	}
	// Every pass the controller makes is recorded. It makes one at a time, in the order its watch heard of the
	// JIs (the work queue is first in, first out at one priority).
	var (
		mu     sync.Mutex
		passed = map[types.NamespacedName]int{}
	)
	mgr, err := manager.New(cp.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Namespaces: []string{mine}, Selector: sel,
		Restartable: true, ConcurrentReconciles: 1, Instrument: func(m ctrl.Manager) ctrl.Manager {
			return harness.WithReconciled(m, func(_ string, req reconcile.Request, _ error) {
				mu.Lock()
				defer mu.Unlock()
				passed[req.NamespacedName]++
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr)
	ctx := context.Background()
	passes := func(ji *v1alpha1.JointInferenceService) int {
		mu.Lock()
		defer mu.Unlock()
		return passed[client.ObjectKeyFromObject(ji)]
	}

	managed := map[string]string{"lifeline.sedna.io/managed": "true"}
	// A pass over a first selected JI shows the controller watching: what it lists as its watch starts comes in
	// no particular order, what is created from now on comes in the order it is created.
	first := createJI(t, mine, "first", managed)
	testkit.Until(t, 30*time.Second, "a pass over the first selected JI", func() bool { return passes(first) > 0 })
	unlabelled := createJI(t, mine, "unlabelled", nil)
	elsewhere := createJI(t, other, "elsewhere", managed)
	// Created last: had the cache held the others, the controller would have begun its passes over them before
	// its first over this one.
	selected := createJI(t, mine, "selected", managed)

	harness.Eventually(t, 30*time.Second, "the selected JIs reconciled", func(ctx context.Context) (bool, error) {
		for _, ji := range []*v1alpha1.JointInferenceService{first, selected} {
			got := &v1alpha1.JointInferenceService{}
			if err := kube.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
				return false, err
			}
			if got.Status.ObservedGeneration != got.Generation || passes(ji) == 0 {
				return false, fmt.Errorf("%s: status %+v, %d passes", ji.Name, got.Status, passes(ji))
			}
		}
		if n := deployments(t, mine); n != 4 {
			return false, fmt.Errorf("%d Deployments", n)
		}
		return true, nil
	})
	for _, ji := range []*v1alpha1.JointInferenceService{unlabelled, elsewhere} {
		if n := passes(ji); n != 0 {
			t.Errorf("%s/%s outside the scope was reconciled %d times", ji.Namespace, ji.Name, n)
		}
	}
	for _, ji := range []*v1alpha1.JointInferenceService{unlabelled, elsewhere} {
		got := &v1alpha1.JointInferenceService{}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			t.Fatal(err)
		}
		if got.Status.ObservedGeneration != 0 || len(got.Status.Conditions) != 0 {
			t.Errorf("%s/%s outside the scope got a status: %+v", ji.Namespace, ji.Name, got.Status)
		}
	}
	if n := deployments(t, mine); n != 4 {
		t.Errorf("%d Deployments in %s, want only the selected JIs' 4", n, mine)
	}
	if n := deployments(t, other); n != 0 {
		t.Errorf("%d Deployments in %s, outside the scope", n, other)
	}
}
