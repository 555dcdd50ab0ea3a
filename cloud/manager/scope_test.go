package manager_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	mgr, err := manager.New(cp.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Namespaces: []string{mine}, Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr)
	ctx := context.Background()

	managed := map[string]string{"lifeline.sedna.io/managed": "true"}
	selected := createJI(t, mine, "selected", managed)
	unlabelled := createJI(t, mine, "unlabelled", nil)
	elsewhere := createJI(t, other, "elsewhere", managed)

	deadline := time.Now().Add(30 * time.Second)
	for {
		got := &v1alpha1.JointInferenceService{}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(selected), got); err != nil {
			t.Fatal(err)
		}
		if got.Status.ObservedGeneration == got.Generation && deployments(t, mine) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the selected JI was not reconciled: status %+v, %d Deployments", got.Status, deployments(t, mine))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // what the controller would do to the others, it does in the same while
	for _, ji := range []*v1alpha1.JointInferenceService{unlabelled, elsewhere} {
		got := &v1alpha1.JointInferenceService{}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			t.Fatal(err)
		}
		if got.Status.ObservedGeneration != 0 || len(got.Status.Conditions) != 0 {
			t.Errorf("%s/%s outside the scope got a status: %+v", ji.Namespace, ji.Name, got.Status)
		}
	}
	if n := deployments(t, mine); n != 2 {
		t.Errorf("%d Deployments in %s, want only the selected JI's 2", n, mine)
	}
	if n := deployments(t, other); n != 0 {
		t.Errorf("%d Deployments in %s, outside the scope", n, other)
	}
}
