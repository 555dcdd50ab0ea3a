package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// kubectlOn runs the pinned kubectl against cp.
func kubectlOn(t *testing.T, cp *harness.ControlPlane, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(cp.BinDir, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

var (
	flGVR = schema.GroupVersionResource{Group: "sedna.io", Version: "v1alpha1", Resource: "federatedlearningjobs"}
	jiGVR = schema.GroupVersionResource{Group: "sedna.io", Version: "v1alpha1", Resource: "jointinferenceservices"}
)

// createWithStatus creates a fixture object and writes status as GM's UpdateStatus would, under Sedna's CRDs.
func createWithStatus(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, file, ns string, status map[string]any) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	set := must(testkit.Examples())
	objs, err := set.Load(file, testkit.DefaultVars)
	if err != nil {
		t.Fatal(err)
	}
	var obj *unstructured.Unstructured
	for _, o := range objs {
		if strings.EqualFold(o.GetKind()+"s", gvr.Resource) {
			obj = o
		}
	}
	if obj == nil {
		t.Fatalf("%s holds no %s", file, gvr.Resource)
	}
	obj.SetNamespace(ns)
	created, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating %s under Sedna's CRD: %v", file, err)
	}
	created.Object["status"] = status
	if created, err = dyn.Resource(gvr).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("writing GM's status of %s: %v", file, err)
	}
	return created
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A cluster that ran Sedna's GlobalManager is handed over to Lifeline as docs/operations.md ("Migrating from Sedna
// GM") says: Sedna's CRDs created with `kubectl create`, objects and status as GM wrote them, then Lifeline's CRDs
// applied over them with the pinned kubectl, Lifeline started, and `kubectl wait` on the conditions Lifeline writes.
func TestHandOverFromSednaGM(t *testing.T) {
	skipShort(t)
	ctx := context.Background()
	root := must(testkit.RepoRoot())
	sednaDir, err := testkit.SednaDir()
	if errors.Is(err, testkit.ErrNoSedna) {
		t.Skipf("the hand-over starts from upstream Sedna's CRDs: %v", err)
	}
	sednaCRDs := filepath.Join(must(sednaDir, err), "crds")
	if _, err := os.Stat(sednaCRDs); err != nil {
		t.Skipf("no upstream CRDs in %s", sednaCRDs)
	}
	// A control plane of its own, with no CRD at start, unlike the simulation's: the test installs Sedna's as
	// Sedna's install does.
	cp, err := harness.StartControlPlane(ctx, harness.ControlPlaneOptions{WithoutScheduler: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			cp.KeepDir()
			t.Logf("control-plane logs kept in %s", cp.Dir)
		}
		cp.Stop()
	}()
	kube := must(kubernetes.NewForConfig(cp.Config))
	dyn := must(dynamic.NewForConfig(cp.Config))
	kctx, stopKubelet := context.WithCancel(ctx)
	defer stopKubelet()
	if _, err := simnode.StartKubelet(kctx, kube, map[string]string{"node-role.kubernetes.io/edge": ""}, harness.FixtureNodes...); err != nil {
		t.Fatal(err)
	}

	// Sedna's CRDs, created as they must be: too large for a client-side apply's last-applied annotation.
	kubectlOn(t, cp, "create", "-f", sednaCRDs)
	kubectlOn(t, cp, "wait", "--for=condition=Established", "crd/federatedlearningjobs.sedna.io", "crd/jointinferenceservices.sedna.io", "--timeout=30s")
	const ns = "default"
	gmTime := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	// GM's FL sync on completion: NewJobCondition(FLJobCondComplete, "", "") — lastProbeTime and
	// lastHeartbeatTime, no reason, no message, no lastTransitionTime.
	done := createWithStatus(t, dyn, flGVR, "federated-learning.yaml", ns, map[string]any{
		"startTime": gmTime, "completionTime": gmTime, "active": int64(0), "succeeded": int64(3), "failed": int64(0),
		"phase":      "Succeeded",
		"conditions": []any{map[string]any{"type": "Complete", "status": "True", "lastProbeTime": gmTime, "lastHeartbeatTime": gmTime}},
	})
	// GM's JI sync: a Running condition appended by newServiceCondition, no reason, no message.
	jiObj := createWithStatus(t, dyn, jiGVR, "joint-inference.yaml", ns, map[string]any{
		"startTime": gmTime, "active": int64(2), "failed": int64(0),
		"conditions": []any{map[string]any{"type": "Running", "status": "True", "lastHeartbeatTime": gmTime, "lastTransitionTime": gmTime}},
	})

	// Lifeline's install, step 1 of the guide, with the pinned kubectl.
	// Over CRDs another manager made, server-side apply must take their fields: --force-conflicts.
	out := kubectlOn(t, cp, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(root, "deploy", "crds"))
	t.Logf("%s", out)
	kubectlOn(t, cp, "wait", "--for=condition=Established", "crd/federatedlearningjobs.sedna.io", "crd/jointinferenceservices.sedna.io", "--timeout=30s")

	scheme := must(manager.Scheme())
	c := must(client.New(cp.Config, client.Options{Scheme: scheme}))
	// What GM stored reads back under Lifeline's types.
	var ji *v1alpha1.JointInferenceService
	harness.Eventually(t, 30*time.Second, "stored objects readable under Lifeline's CRDs", func(ctx context.Context) (bool, error) {
		fl := &v1alpha1.FederatedLearningJob{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: done.GetName()}, fl); err != nil {
			return false, err
		}
		if fl.UID != done.GetUID() || len(fl.Spec.TrainingWorkers) != 2 || fl.Status.Phase != v1alpha1.FLJobSucceeded {
			return false, fmt.Errorf("job read back as %+v", fl)
		}
		ji = &v1alpha1.JointInferenceService{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: jiObj.GetName()}, ji); err != nil {
			return false, err
		}
		return ji.Spec.EdgeWorker.HardExampleMining.Name != "", nil
	})
	for _, m := range []string{ji.Spec.EdgeWorker.Model.Name, ji.Spec.CloudWorker.Model.Name} {
		if err := c.Create(ctx, &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m},
			Spec: v1alpha1.ModelSpec{URL: "/models/" + m + ".pb", Format: "pb"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := harness.CreateSednaJIChildren(ctx, c, ji); err != nil {
		t.Fatal(err)
	}

	mgr := must(manager.New(cp.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0"}))
	mctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(mctx) }()
	defer func() { cancel(); <-stopped }()

	// The status GM wrote is written back, made valid: the finished job keeps Complete, with a reason and a
	// transition time; the service's Running gives way to Ready.
	harness.Eventually(t, 30*time.Second, "Lifeline's status written over GM's", func(ctx context.Context) (bool, error) {
		fl := &v1alpha1.FederatedLearningJob{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: done.GetName()}, fl); err != nil {
			return false, err
		}
		complete := meta.FindStatusCondition(fl.Status.Conditions, v1alpha1.FLConditionComplete)
		if fl.Status.ObservedGeneration != fl.Generation || complete == nil || complete.Reason != "Complete" || complete.LastTransitionTime.IsZero() {
			return false, fmt.Errorf("job status %+v", fl.Status)
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ji.Name}, ji); err != nil {
			return false, err
		}
		if ji.Status.ObservedGeneration != ji.Generation || meta.FindStatusCondition(ji.Status.Conditions, "Running") != nil ||
			meta.FindStatusCondition(ji.Status.Conditions, jointinference.ConditionReady) == nil {
			return false, fmt.Errorf("service status %+v", ji.Status)
		}
		return true, nil
	})
	if pods := must(kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})); len(pods.Items) != 2 {
		t.Errorf("%d pods: the finished job must run nothing, the service only GM's two", len(pods.Items))
	}
	// The conditions the guide tells users to wait for.
	kubectlOn(t, cp, "wait", "--for=condition=Complete", "federatedlearningjob/"+done.GetName(), "-n", ns, "--timeout=30s")
	kubectlOn(t, cp, "wait", "--for=condition=Ready", "jointinferenceservice/"+ji.Name, "-n", ns, "--timeout=60s")
	for _, cond := range ji.Status.Conditions {
		if _, changed := conditions.Normalize([]metav1.Condition{cond}, nil, metav1.Now()); changed {
			t.Errorf("condition %+v still needs normalising", cond)
		}
	}
}
