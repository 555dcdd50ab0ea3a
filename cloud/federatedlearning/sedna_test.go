package federatedlearning_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// eventCount counts the Events of a namespace with a reason.
func eventCount(t testing.TB, ns, reason string) int {
	t.Helper()
	evs, err := env.Kube.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Reason == reason {
			n += int(max(e.DeprecatedCount, 1))
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	return n
}

// A job Sedna's GM was running when Lifeline took over: its pods (random names, no Lifeline mark) are its workers,
// carried to completion; none is created twice, and a failed one is rebuilt under Lifeline's stable name.
func TestSednaPodsOfARunningJobAreAdoptedAndCarriedToCompletion(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	job := loadJob(t, "federated-learning.yaml", env.NewNamespace(t, "fl-gm"))
	var gm *harness.SednaFLChildren
	env.WithControllerStopped(t, func() {
		if err := env.Client.Create(ctx, job); err != nil {
			t.Fatal(err)
		}
		var err error
		if gm, err = harness.CreateSednaFLChildren(ctx, env.Client, job); err != nil {
			t.Fatal(err)
		}
		// GM's sync: startTime on the first pass, phase Running and the active count; no condition until the end.
		now := metav1.Now()
		job.Status = v1alpha1.FederatedLearningJobStatus{StartTime: &now, Active: 3, Phase: v1alpha1.FLJobRunning}
		if err := env.Client.Status().Update(ctx, job); err != nil {
			t.Fatalf("writing GM's status: %v", err)
		}
	})
	gmPods := append([]*corev1.Pod{gm.Aggregator}, gm.Trainers...)

	eventually(t, within, "GM's pods adopted as the job's workers", func(ctx context.Context) (bool, error) {
		got := getJob(t, job)
		for i, p := range gmPods {
			cur := &corev1.Pod{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
				return false, err
			}
			wantRole, wantIndex := string(v1alpha1.WorkerRoleAggregator), ""
			if i > 0 {
				wantRole, wantIndex = string(v1alpha1.WorkerRoleTrainer), fmt.Sprint(i-1)
			}
			if cur.Labels[contract.RoleLabel] != wantRole || cur.Labels[fl.IndexLabel] != wantIndex ||
				!controllerutilContains(cur.Finalizers, fl.WorkerFinalizer) {
				return false, fmt.Errorf("pod %s: labels %v finalizers %v", cur.Name, cur.Labels, cur.Finalizers)
			}
		}
		if len(got.Status.Workers) != 3 {
			return false, fmt.Errorf("workers %+v", got.Status.Workers)
		}
		for _, w := range got.Status.Workers {
			if w.Phase != string(corev1.PodRunning) {
				return false, fmt.Errorf("worker %s is %s", w.Name, w.Phase)
			}
		}
		return got.Status.Phase == v1alpha1.FLJobRunning, nil
	})
	env.Passes(t, job, 2) // passes over the adopted job: none may create a second aggregator or trainer
	pods := workerPods(t, job)
	if len(pods) != 3 {
		t.Fatalf("pods %v: want GM's three only", keys(pods))
	}
	svc := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(gm.Service), svc); err != nil || svc.UID != gm.Service.UID {
		t.Fatalf("GM's Service was not kept: %v", err)
	}
	if n := eventCount(t, job.Namespace, fl.ReasonSuccessfulCreate); n != 0 {
		t.Errorf("%d SuccessfulCreate events while nothing was created", n)
	}
	// The events of the adopting pass are written after it, by the recorder's own goroutine.
	eventually(t, within, "an Adopted event for each of GM's pods", func(context.Context) (bool, error) {
		if n := eventCount(t, job.Namespace, fl.ReasonAdopted); n < 3 {
			return false, fmt.Errorf("%d Adopted events", n)
		}
		return true, nil
	})
	if n := eventCount(t, job.Namespace, fl.ReasonAdopted); n != 3 {
		t.Errorf("%d Adopted events, want 3", n)
	}

	// GM's first trainer fails: counted, deleted, rebuilt under the stable name; the aggregator stays GM's.
	endPod(t, gm.Trainers[0], corev1.PodFailed, 1)
	stable := fl.TrainerName(job.Name, 0)
	eventually(t, within, "the failed trainer rebuilt as "+stable, func(ctx context.Context) (bool, error) {
		ps := workerPods(t, job)
		if _, ok := ps[gm.Trainers[0].Name]; ok {
			return false, fmt.Errorf("GM's failed trainer still there")
		}
		p := ps[stable]
		return p != nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if got := workerRecord(getJob(t, job), stable); got.Failures != 1 {
		t.Errorf("record of %s: %+v, want one failure", stable, got)
	}
	if n := eventCount(t, job.Namespace, fl.ReasonSuccessfulCreate); n != 1 {
		t.Errorf("%d SuccessfulCreate events, want 1 (the rebuilt trainer)", n)
	}
	if n := eventCount(t, job.Namespace, fl.ReasonSuccessfulDelete); n != 1 {
		t.Errorf("%d SuccessfulDelete events, want 1 (the failed trainer)", n)
	}
	selected := &corev1.PodList{}
	if err := env.Client.List(ctx, selected, client.InNamespace(job.Namespace),
		client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(svc.Spec.Selector)}); err != nil {
		t.Fatal(err)
	}
	if len(selected.Items) != 1 || selected.Items[0].Name != gm.Aggregator.Name {
		t.Errorf("the Service selects %d pods, want GM's aggregator alone", len(selected.Items))
	}

	// GM's aggregator finishes: the job completes as if Lifeline had made it.
	endPod(t, gm.Aggregator, corev1.PodSucceeded, 0)
	got := waitCondition(t, job, v1alpha1.FLConditionComplete, fl.ReasonCompleted)
	if got.Status.Phase != v1alpha1.FLJobSucceeded {
		t.Errorf("phase %s after completion", got.Status.Phase)
	}
	if _, ok := workerPods(t, job)[fl.AggregatorName(job.Name)]; ok {
		t.Error("a second aggregator was created")
	}
}

// A job created before its Model and Datasets waits for them, and starts as soon as they appear: the controller
// watches Models and Datasets, so the job does not wait for a resync.
func TestJobCreatedBeforeItsInputsStartsWhenTheyAppear(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "fl-inputs")
	job := &v1alpha1.FederatedLearningJob{}
	if err := testkit.LoadObject("federated-learning.yaml", testkit.DefaultVars, job); err != nil {
		t.Fatal(err)
	}
	job.Namespace = ns
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "Training=False/InputsNotFound", func(ctx context.Context) (bool, error) {
		got := getJob(t, job)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.FLConditionTraining)
		return c != nil && c.Reason == fl.ReasonInputsNotFound, nil
	})
	// The job's own passes end, and none is left queued for later: only the inputs can wake it now.
	env.Passes(t, job, 2)
	loadJob(t, "federated-learning.yaml", ns) // creates the Model and the Datasets
	start := time.Now()
	waitRunning(t, job, 3)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the job started %s after its inputs appeared", d)
	}
}

// Uninstalling: ReleaseFinalizers removes Lifeline's finalizer from every pod that has it, and changes nothing
// else.
func TestReleaseFinalizersRemovesOnlyLifelinesFinalizer(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "fl-release")
	const other = "example.com/keep"
	finalizers := map[string][]string{
		"ours":   {fl.WorkerFinalizer},
		"both":   {other, fl.WorkerFinalizer},
		"theirs": {other},
		"none":   nil,
	}
	created := map[string]*corev1.Pod{}
	for name, fs := range finalizers {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Finalizers: fs,
			Labels: map[string]string{contract.RoleLabel: "trainer"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		created[name] = p
	}
	n, err := fl.ReleaseFinalizers(ctx, env.Client)
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Errorf("released %d pods, want at least this test's 2", n)
	}
	want := map[string][]string{"ours": nil, "both": {other}, "theirs": {other}, "none": nil}
	for name, p := range created {
		got := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got.Finalizers) != fmt.Sprint(want[name]) {
			t.Errorf("%s: finalizers %v, want %v", name, got.Finalizers, want[name])
		}
		if untouched := len(finalizers[name]) == len(want[name]); untouched && got.ResourceVersion != p.ResourceVersion {
			t.Errorf("%s was written though it has no Lifeline finalizer", name)
		}
		if fmt.Sprint(got.Labels) != fmt.Sprint(p.Labels) {
			t.Errorf("%s: labels changed to %v", name, got.Labels)
		}
	}
	for _, p := range created {
		if err := env.Client.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Error(err)
		}
		_ = env.Client.Delete(ctx, p)
	}
}

// Uninstalling in the cluster: StopDeployment scales the controller's Deployment to zero and returns only once
// its pods are gone, so ReleaseFinalizers after it races no controller.
func TestStopDeploymentWaitsForItsPodsToEnd(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "fl-stop")
	labels := map[string]string{"app": "lifeline-controller"}
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "lifeline-controller", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "lifeline/lifeline-controller"}}}}}}
	if err := env.Client.Create(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	countPods := func() int {
		pods := &corev1.PodList{}
		if err := env.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
			t.Fatal(err)
		}
		return len(pods.Items)
	}
	eventually(t, within, "the Deployment's pods", func(context.Context) (bool, error) {
		if n := countPods(); n < 2 {
			return false, fmt.Errorf("%d of 2 pods", n)
		}
		return true, nil
	})
	key := types.NamespacedName{Namespace: ns, Name: deploy.Name}
	if err := fl.StopDeployment(ctx, env.Client, key, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := countPods(); n != 0 {
		t.Errorf("StopDeployment returned with %d pods left", n)
	}
	got := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Replicas == nil || *got.Spec.Replicas != 0 {
		t.Errorf("replicas = %v, want 0", got.Spec.Replicas)
	}
	if err := fl.StopDeployment(ctx, env.Client, types.NamespacedName{Namespace: ns, Name: "absent"}, time.Second); err != nil {
		t.Errorf("a missing Deployment is already stopped, got %v", err)
	}
}
