package jointinference_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

const (
	readyWithin    = 30 * time.Second
	reconcileBound = 10 * time.Second // generous bound for one reconcile on a loaded 2-core machine
)

func newNamespace(t testing.TB) string { return env.NewNamespace(t, "ji") }

func createModel(t testing.TB, ns, name, url string) *v1alpha1.Model {
	t.Helper()
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.ModelSpec{URL: url, Format: "pb"}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatalf("creating model %s: %v", name, err)
	}
	return m
}

// loadJI reads the service of one of Lifeline's examples into namespace ns.
func loadJI(t testing.TB, file, ns string) *v1alpha1.JointInferenceService {
	t.Helper()
	set, err := testkit.Examples()
	if err != nil {
		t.Fatal(err)
	}
	return loadJIFrom(t, set, file, ns)
}

// loadJIFrom reads the service of an example file of set into namespace ns.
func loadJIFrom(t testing.TB, set testkit.Set, file, ns string) *v1alpha1.JointInferenceService {
	t.Helper()
	ji := &v1alpha1.JointInferenceService{}
	if err := set.LoadObject(file, testkit.DefaultVars, ji); err != nil {
		t.Fatal(err)
	}
	ji.Namespace = ns
	return ji
}

// createService creates the service of one of Lifeline's examples with its Models, in a new namespace.
func createService(t testing.TB, file string) *v1alpha1.JointInferenceService {
	t.Helper()
	set, err := testkit.Examples()
	if err != nil {
		t.Fatal(err)
	}
	return createServiceFrom(t, set, file)
}

// createServiceFrom creates the service of an example file of set with its Models, in a new namespace. The
// Models are the test's, so their URLs are known whatever the example says.
func createServiceFrom(t testing.TB, set testkit.Set, file string) *v1alpha1.JointInferenceService {
	t.Helper()
	ns := newNamespace(t)
	ji := loadJIFrom(t, set, file, ns)
	createModel(t, ns, ji.Spec.EdgeWorker.Model.Name, "/models/little.pb")
	createModel(t, ns, ji.Spec.CloudWorker.Model.Name, "/models/big.pb")
	if err := env.Client.Create(context.Background(), ji); err != nil {
		t.Fatalf("creating %s: %v", ji.Name, err)
	}
	return ji
}

func readyCondition(ji *v1alpha1.JointInferenceService) *metav1.Condition {
	return meta.FindStatusCondition(ji.Status.Conditions, jointinference.ConditionReady)
}

// waitReady waits for Ready=True at the service's current generation.
func waitReady(t testing.TB, ji *v1alpha1.JointInferenceService) *v1alpha1.JointInferenceService {
	t.Helper()
	got := &v1alpha1.JointInferenceService{}
	eventually(t, readyWithin, ji.Name+" to be Ready", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		c := readyCondition(got)
		if c == nil {
			return false, fmt.Errorf("no Ready condition")
		}
		if c.Status != metav1.ConditionTrue || got.Status.ObservedGeneration != got.Generation {
			return false, fmt.Errorf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
		}
		return true, nil
	})
	return got
}

func deployment(t *testing.T, ji *v1alpha1.JointInferenceService, workerType string) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ji.Namespace,
		Name: jointinference.DeploymentName(ji.Name, workerType)}, d); err != nil {
		t.Fatalf("reading %s deployment: %v", workerType, err)
	}
	return d
}

func containerEnv(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// TestExamplesReachTheirChildren creates the service of every example, Lifeline's and upstream Sedna's, and
// checks the children and the contract its workers get.
func TestExamplesReachTheirChildren(t *testing.T) {
	harness.SkipIfShort(t)
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		files, err := set.FilesOf(jointinference.Kind, testkit.DefaultVars)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s files with a %s: %v, %v", set.Name, jointinference.Kind, files, err)
		}
		testExamplesReachTheirChildren(t, set, files)
	})
}

func testExamplesReachTheirChildren(t *testing.T, set testkit.Set, files []string) {
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			ji := createServiceFrom(t, set, file)
			got := waitReady(t, ji)
			if got.Status.EdgeReady != "1/1" || got.Status.CloudReady != "1/1" || got.Status.StartTime == nil {
				t.Errorf("status edge=%q cloud=%q start=%v", got.Status.EdgeReady, got.Status.CloudReady, got.Status.StartTime)
			}
			edge, cloud := deployment(t, ji, "edge"), deployment(t, ji, "cloud")
			edgeEnv := containerEnv(edge.Spec.Template.Spec.Containers[0])
			for k, want := range map[string]string{
				contract.EnvNamespace: ji.Namespace, contract.EnvServiceName: ji.Name, contract.EnvWorkerName: edge.Name,
				contract.EnvBigModelIP: ji.Name + "-cloud." + ji.Namespace, contract.EnvBigModelPort: "5000",
				contract.EnvHEMName: ji.Spec.EdgeWorker.HardExampleMining.Name, contract.EnvLCServer: contract.DefaultLCServer,
				contract.EnvModelURL: "/home/data/models/little.pb",
			} {
				if edgeEnv[k] != want {
					t.Errorf("edge env %s = %q, want %q", k, edgeEnv[k], want)
				}
			}
			if env := containerEnv(cloud.Spec.Template.Spec.Containers[0]); env[contract.EnvBigModelBindPort] != "5000" ||
				env[contract.EnvModelURL] != "/home/data/models/big.pb" {
				t.Errorf("cloud env = %v", env)
			}
			svc := &corev1.Service{}
			if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ji.Namespace, Name: ji.Name + "-cloud"}, svc); err != nil {
				t.Fatalf("cloud service: %v", err)
			}
			if p := svc.Spec.Ports[0]; p.Name != "tcp-0" || p.Port != 5000 {
				t.Errorf("service port = %+v", p)
			}
			hpas := &autoscalingv2.HorizontalPodAutoscalerList{}
			if err := env.Client.List(context.Background(), hpas, client.InNamespace(ji.Namespace)); err != nil {
				t.Fatal(err)
			}
			wantHPAs := 0
			if ji.Spec.EdgeWorker.HPA != nil {
				wantHPAs = 2
			}
			if len(hpas.Items) != wantHPAs {
				t.Errorf("HPAs = %d, want %d", len(hpas.Items), wantHPAs)
			}
			// The pods the Deployment controller made carry the contract, the edge one the disconnection tolerations.
			pods := &corev1.PodList{}
			if err := env.Client.List(context.Background(), pods, client.InNamespace(ji.Namespace),
				client.MatchingLabels{contract.RoleLabel: "edge"}); err != nil || len(pods.Items) == 0 {
				t.Fatalf("edge pods: %d, %v", len(pods.Items), err)
			}
			assertUnboundedTolerations(t, &pods.Items[0])
			if len(got.Status.Workers) != 2 {
				t.Errorf("status.workers = %+v, want one entry per worker pod", got.Status.Workers)
			}
		})
	}
}

func assertUnboundedTolerations(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	for _, taint := range []string{contract.TaintUnreachable, contract.TaintNotReady} {
		ok := false
		for _, tol := range pod.Spec.Tolerations {
			if tol.Key == taint && tol.Effect == corev1.TaintEffectNoExecute && tol.TolerationSeconds == nil {
				ok = true
			}
		}
		if !ok {
			t.Errorf("pod %s tolerates %s only for a while: %+v", pod.Name, taint, pod.Spec.Tolerations)
		}
	}
}

// TestDeletedChildrenComeBack deletes each kind of child and expects it back, new, from the current spec.
func TestDeletedChildrenComeBack(t *testing.T) {
	harness.SkipIfShort(t)
	ji := createService(t, "joint-inference-hpa.yaml")
	waitReady(t, ji)
	children := []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: jointinference.DeploymentName(ji.Name, "edge")}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: jointinference.DeploymentName(ji.Name, "cloud")}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: jointinference.ServiceName(ji.Name)}},
		&autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: jointinference.HPAName(jointinference.DeploymentName(ji.Name, "edge"))}},
	}
	for _, child := range children {
		kind := fmt.Sprintf("%T", child)
		t.Run(kind+"/"+child.GetName(), func(t *testing.T) {
			child.SetNamespace(ji.Namespace)
			key := client.ObjectKeyFromObject(child)
			if err := env.Client.Get(context.Background(), key, child); err != nil {
				t.Fatal(err)
			}
			oldUID := child.GetUID()
			if err := env.Client.Delete(context.Background(), child); err != nil {
				t.Fatal(err)
			}
			eventually(t, reconcileBound, "a new "+child.GetName(), func(ctx context.Context) (bool, error) {
				if err := env.Client.Get(ctx, key, child); err != nil {
					return false, err
				}
				return child.GetUID() != oldUID && metav1.IsControlledBy(child, ji), nil
			})
		})
	}
	waitReady(t, ji)
}

// TestCreationsAreToldInOneEventPerPass expects a new service's Service first, alone in its pass and its Event
// (which names it as the related object), then its two Deployments in one Event of the next pass; and a pass that
// rebuilds the Service to tell of it the same way.
func TestCreationsAreToldInOneEventPerPass(t *testing.T) {
	harness.SkipIfShort(t)
	ji := createService(t, "joint-inference.yaml")
	waitReady(t, ji)
	creations := func(ctx context.Context) ([]eventsv1.Event, error) {
		evs, err := env.Kube.EventsV1().Events(ji.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []eventsv1.Event
		for _, e := range evs.Items {
			if e.Reason == jointinference.ReasonSuccessfulCreate && e.Regarding.Name == ji.Name {
				out = append(out, e)
			}
		}
		return out, nil
	}
	var first []eventsv1.Event
	eventually(t, reconcileBound, "two SuccessfulCreate events", func(ctx context.Context) (bool, error) {
		var err error
		first, err = creations(ctx)
		return len(first) >= 2, err
	})
	// The Service first, alone in its pass; the Deployments in the next.
	slices.SortFunc(first, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	service, deployments := "Service "+jointinference.ServiceName(ji.Name),
		"Deployment "+jointinference.DeploymentName(ji.Name, "cloud")+", Deployment "+jointinference.DeploymentName(ji.Name, "edge")
	if len(first) != 2 || first[0].Note != "Created "+service || first[0].Related == nil || first[0].Related.Kind != "Service" ||
		first[1].Note != "Created "+deployments || first[1].Related != nil {
		t.Fatalf("creation events %+v, want %q then %q", first, "Created "+service, "Created "+deployments)
	}

	rebuilt := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ji.Namespace, Name: jointinference.ServiceName(ji.Name)}}
	if err := env.Client.Delete(context.Background(), rebuilt); err != nil {
		t.Fatal(err)
	}
	eventually(t, reconcileBound, "a SuccessfulCreate event of the rebuilt Service", func(ctx context.Context) (bool, error) {
		evs, err := creations(ctx)
		for _, e := range evs {
			if e.Related != nil && e.Related.Kind == "Service" && e.Related.Name == rebuilt.Name && e.Note == "Created "+service && e.EventTime.After(first[1].EventTime.Time) {
				return true, err
			}
		}
		return false, err
	})
}

// TestTemplateEditRollsTheWorker edits the edge template and expects a new ReplicaSet whose pod has the edit.
func TestTemplateEditRollsTheWorker(t *testing.T) {
	harness.SkipIfShort(t)
	ji := createService(t, "joint-inference.yaml")
	ji = waitReady(t, ji)
	ji.Spec.EdgeWorker.Template.Spec.Containers[0].Env = append(ji.Spec.EdgeWorker.Template.Spec.Containers[0].Env,
		corev1.EnvVar{Name: "threshold", Value: "0.7"})
	if err := env.Client.Update(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	assertRolledOut(t, ji, "edge", "threshold", "0.7")
	waitReady(t, ji)
}

// assertRolledOut waits for a running pod of the worker whose container has env name=value, from a second
// ReplicaSet of the worker's Deployment.
func assertRolledOut(t *testing.T, ji *v1alpha1.JointInferenceService, workerType, name, value string) {
	t.Helper()
	eventually(t, readyWithin, fmt.Sprintf("a %s pod with %s=%s", workerType, name, value), func(ctx context.Context) (bool, error) {
		rss := &appsv1.ReplicaSetList{}
		if err := env.Client.List(ctx, rss, client.InNamespace(ji.Namespace), client.MatchingLabels{
			contract.LabelPrefix(jointinference.Kind) + "worker-type": workerType}); err != nil {
			return false, err
		}
		if len(rss.Items) < 2 {
			return false, fmt.Errorf("%d ReplicaSets", len(rss.Items))
		}
		pods := &corev1.PodList{}
		if err := env.Client.List(ctx, pods, client.InNamespace(ji.Namespace), client.MatchingLabels{contract.RoleLabel: workerType}); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && containerEnv(p.Spec.Containers[0])[name] == value {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pods, none running with the edit", len(pods.Items))
	})
}

func TestEditWhileControllerIsDownIsAppliedOnStart(t *testing.T) {
	harness.SkipIfShort(t)
	ji := createService(t, "joint-inference.yaml")
	ji = waitReady(t, ji)
	env.WithControllerStopped(t, func() {
		ji.Spec.CloudWorker.Template.Spec.Containers[0].Env = append(ji.Spec.CloudWorker.Template.Spec.Containers[0].Env,
			corev1.EnvVar{Name: "batch", Value: "8"})
		if err := env.Client.Update(context.Background(), ji); err != nil {
			t.Fatal(err)
		}
	})
	assertRolledOut(t, ji, "cloud", "batch", "8")
}

func TestModelEditRollsItsWorkers(t *testing.T) {
	harness.SkipIfShort(t)
	ji := createService(t, "joint-inference.yaml")
	waitReady(t, ji)
	m := &v1alpha1.Model{}
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ji.Namespace, Name: ji.Spec.EdgeWorker.Model.Name}, m); err != nil {
		t.Fatal(err)
	}
	m.Spec.URL = "/models/v2/little.pb"
	if err := env.Client.Update(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	assertRolledOut(t, ji, "edge", contract.EnvModelURL, "/home/data/models/v2/little.pb")
}

func TestMissingModelIsReportedThenResolved(t *testing.T) {
	harness.SkipIfShort(t)
	ns := newNamespace(t)
	ji := loadJI(t, "joint-inference.yaml", ns)
	createModel(t, ns, ji.Spec.CloudWorker.Model.Name, "/models/big.pb")
	if err := env.Client.Create(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.JointInferenceService{}
	eventually(t, reconcileBound, "Ready=False ModelNotFound", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		c := readyCondition(got)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == jointinference.ReasonModelNotFound &&
			strings.Contains(c.Message, ji.Spec.EdgeWorker.Model.Name), nil
	})
	createModel(t, ns, ji.Spec.EdgeWorker.Model.Name, "/models/little.pb")
	waitReady(t, ji)
}

// TestDeletionCascades deletes a service both ways and expects every child, down to the pods, gone.
func TestDeletionCascades(t *testing.T) {
	harness.SkipIfShort(t)
	for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
		t.Run(string(policy), func(t *testing.T) {
			ji := createService(t, "joint-inference-hpa.yaml")
			waitReady(t, ji)
			if err := env.Client.Delete(context.Background(), ji, client.PropagationPolicy(policy)); err != nil {
				t.Fatal(err)
			}
			eventually(t, readyWithin, "every child gone", func(ctx context.Context) (bool, error) {
				left := []string{}
				for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &appsv1.ReplicaSetList{}, &corev1.PodList{},
					&corev1.ServiceList{}, &autoscalingv2.HorizontalPodAutoscalerList{}, &v1alpha1.JointInferenceServiceList{}} {
					if err := env.Client.List(ctx, list, client.InNamespace(ji.Namespace)); err != nil {
						return false, err
					}
					if n := meta.LenList(list); n > 0 {
						left = append(left, fmt.Sprintf("%d %T", n, list))
					}
				}
				if len(left) > 0 {
					return false, fmt.Errorf("left: %v", left)
				}
				return true, nil
			})
		})
	}
}

func TestRecreatingTheSameNameRightAfterDeletionWorks(t *testing.T) {
	harness.SkipIfShort(t)
	ji := createService(t, "joint-inference.yaml")
	waitReady(t, ji)
	oldUID := ji.UID
	if err := env.Client.Delete(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	again := loadJI(t, "joint-inference.yaml", ji.Namespace)
	eventually(t, reconcileBound, "re-creating "+ji.Name, func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, again)
		return err == nil, err
	})
	got := waitReady(t, again)
	if got.UID == oldUID {
		t.Fatal("the service was never deleted")
	}
	for _, wt := range []string{"edge", "cloud"} {
		if d := deployment(t, again, wt); !metav1.IsControlledBy(d, got) {
			t.Errorf("%s deployment is not owned by the new service: %+v", wt, d.OwnerReferences)
		}
	}
}

// A Service, or a Deployment, of someone else's under a name the service needs is reported and left alone. The
// controller does not cache the cluster's other Deployments: it finds the foreign one when its creation is refused.
func TestNameConflictIsReportedAndTheForeignObjectLeftAlone(t *testing.T) {
	harness.SkipIfShort(t)
	foreignService := func(ns, ji string) (client.Object, func(client.Object) bool) {
		return &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: jointinference.ServiceName(ji)},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "someone-else"},
					Ports: []corev1.ServicePort{{Port: 80}}},
			}, func(o client.Object) bool {
				s := o.(*corev1.Service)
				return s.Spec.Selector["app"] == "someone-else" && s.Spec.Ports[0].Port == 80
			}
	}
	foreignDeployment := func(ns, ji string) (client.Object, func(client.Object) bool) {
		labels := map[string]string{"app": "someone-else"}
		return &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: jointinference.DeploymentName(ji, "edge")},
				Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "someone/else"}}}}},
			}, func(o client.Object) bool {
				d := o.(*appsv1.Deployment)
				return d.Spec.Template.Spec.Containers[0].Image == "someone/else" && len(d.Spec.Template.Spec.Containers) == 1
			}
	}
	for name, make := range map[string]func(ns, ji string) (client.Object, func(client.Object) bool){
		"service": foreignService, "deployment": foreignDeployment} {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t)
			ji := loadJI(t, "joint-inference.yaml", ns)
			foreign, untouched := make(ns, ji.Name)
			if err := env.Client.Create(context.Background(), foreign); err != nil {
				t.Fatal(err)
			}
			createModel(t, ns, ji.Spec.EdgeWorker.Model.Name, "/models/little.pb")
			createModel(t, ns, ji.Spec.CloudWorker.Model.Name, "/models/big.pb")
			if err := env.Client.Create(context.Background(), ji); err != nil {
				t.Fatal(err)
			}
			got := &v1alpha1.JointInferenceService{}
			eventually(t, reconcileBound, "Ready=False NameConflict", func(ctx context.Context) (bool, error) {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
					return false, err
				}
				c := readyCondition(got)
				return c != nil && c.Reason == jointinference.ReasonNameConflict && strings.Contains(c.Message, foreign.GetName()), nil
			})
			after := foreign.DeepCopyObject().(client.Object)
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(foreign), after); err != nil {
				t.Fatal(err)
			}
			if !untouched(after) || len(after.GetOwnerReferences()) != 0 {
				t.Errorf("the foreign %s was changed: %+v", name, after)
			}
			eventually(t, reconcileBound, "a NameConflict event", func(ctx context.Context) (bool, error) {
				evs, err := env.Kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, err
				}
				for _, e := range evs.Items {
					if e.Reason == jointinference.ReasonNameConflict && e.Regarding.Name == ji.Name {
						return true, nil
					}
				}
				return false, nil
			})
		})
	}
}

// TestSednaChildrenAreAdoptedWithoutRestart makes the children the way Sedna does, with the controller down,
// then starts it: the running pod must stay.
func TestSednaChildrenAreAdoptedWithoutRestart(t *testing.T) {
	harness.SkipIfShort(t)
	ns := newNamespace(t)
	ji := loadJI(t, "joint-inference.yaml", ns)
	createModel(t, ns, ji.Spec.EdgeWorker.Model.Name, "/models/little.pb")
	createModel(t, ns, ji.Spec.CloudWorker.Model.Name, "/models/big.pb")
	var podUIDs []types.UID
	env.WithControllerStopped(t, func() {
		if err := env.Client.Create(context.Background(), ji); err != nil {
			t.Fatal(err)
		}
		if _, err := harness.CreateSednaJIChildren(context.Background(), env.Client, ji); err != nil {
			t.Fatal(err)
		}
		eventually(t, readyWithin, "Sedna's pods running", func(ctx context.Context) (bool, error) {
			pods := &corev1.PodList{}
			if err := env.Client.List(ctx, pods, client.InNamespace(ns)); err != nil {
				return false, err
			}
			podUIDs = nil
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning {
					podUIDs = append(podUIDs, p.UID)
				}
			}
			return len(podUIDs) == 2, nil
		})
	})
	ready := waitReady(t, ji)
	// The pods GM's Deployments made are the service's workers at once: marked for the cache and the agents,
	// and in the status, before any roll.
	eventually(t, reconcileBound, "Sedna's pods in the status", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), ready); err != nil {
			return false, err
		}
		running := 0
		for _, w := range ready.Status.Workers {
			if w.Phase == string(corev1.PodRunning) {
				running++
			}
		}
		if running != 2 || ready.Status.Active != 2 {
			return false, fmt.Errorf("workers %+v", ready.Status.Workers)
		}
		return true, nil
	})
	for _, wt := range []string{"edge", "cloud"} {
		if d := deployment(t, ji, wt); d.Annotations[jointinference.TemplateHashAnnotation] == "" {
			t.Errorf("%s deployment not adopted", wt)
		}
	}
	pods := &corev1.PodList{}
	if err := env.Client.List(context.Background(), pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 || !containsUID(podUIDs, pods.Items[0].UID) || !containsUID(podUIDs, pods.Items[1].UID) {
		t.Errorf("pods after adoption differ from Sedna's: had %v, now %d pods", podUIDs, len(pods.Items))
	}
	for _, p := range pods.Items {
		if p.Labels[contract.RoleLabel] == "" {
			t.Errorf("pod %s lacks %s", p.Name, contract.RoleLabel)
		}
	}
}

func containsUID(uids []types.UID, uid types.UID) bool {
	for _, u := range uids {
		if u == uid {
			return true
		}
	}
	return false
}

// TestMissingCredentialIsReportedThenResolved: a Model whose credential Secret is missing blocks its worker with
// SecretNotFound; creating the Secret (watched, as metadata, through the Model) makes the service Ready, and the
// worker gets the storage initializer reading the Secret's keys by reference: no key is ever written into a
// Deployment or a pod, where every edge agent could read it and would store it on its disk.
func TestMissingCredentialIsReportedThenResolved(t *testing.T) {
	harness.SkipIfShort(t)
	ns := newNamespace(t)
	ji := loadJI(t, "joint-inference.yaml", ns)
	createModel(t, ns, ji.Spec.CloudWorker.Model.Name, "/models/big.pb")
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ji.Spec.EdgeWorker.Model.Name},
		Spec: v1alpha1.ModelSpec{URL: "s3://models/little.pb", Format: "pb", CredentialName: "s3-cred"}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.JointInferenceService{}
	eventually(t, reconcileBound, "Ready=False SecretNotFound", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		c := readyCondition(got)
		return c != nil && c.Reason == jointinference.ReasonSecretNotFound && strings.Contains(c.Message, "s3-cred"), nil
	})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3-cred",
		Annotations: map[string]string{contract.AnnotationS3Endpoint: "minio.storage:9000"}},
		StringData: map[string]string{contract.EnvAccessKeyID: "access-key-7f3c", contract.EnvSecretAccessKey: "secret-key-9e1d"}}
	if err := env.Client.Create(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ji)
	edge := deployment(t, ji, "edge")
	inits := edge.Spec.Template.Spec.InitContainers
	if len(inits) != 1 || inits[0].Image != contract.StorageInitializerImage {
		t.Fatalf("init containers %+v, want the storage initializer", inits)
	}
	if env := containerEnv(inits[0]); env[contract.EnvS3EndpointURL] != "https://minio.storage:9000" {
		t.Errorf("initializer env %v", env)
	}
	for _, e := range inits[0].Env {
		if e.Name != contract.EnvAccessKeyID && e.Name != contract.EnvSecretAccessKey {
			continue
		}
		if ref := e.ValueFrom; e.Value != "" || ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "s3-cred" || ref.SecretKeyRef.Key != e.Name {
			t.Errorf("initializer %s = %+v, want a reference to key %s of Secret s3-cred", e.Name, e, e.Name)
		}
	}
	pods := &corev1.PodList{}
	if err := env.Client.List(context.Background(), pods, client.InNamespace(ns)); err != nil || len(pods.Items) == 0 {
		t.Fatalf("pods: %d, %v", len(pods.Items), err)
	}
	for _, obj := range []any{edge, pods} {
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"access-key-7f3c", "secret-key-9e1d"} {
			if strings.Contains(string(data), key) {
				t.Errorf("a credential key is written in %T", obj)
			}
		}
	}
	if env := containerEnv(edge.Spec.Template.Spec.Containers[0]); env[contract.EnvModelURL] != "/downloads/models/little.pb" {
		t.Errorf("MODEL_URL = %q", env[contract.EnvModelURL])
	}
}
