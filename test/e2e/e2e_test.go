// Package e2e runs Lifeline end to end on the simulated edge: the real control plane, lifeline-controller and
// hollow edge nodes running the sample workers as processes.
package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var s *harness.Sim

const within = 60 * time.Second

var eventually = harness.Eventually

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	var err error
	// The kubelet's crash back-off, so that what restarts a worker quickly on a cut-off node is Lifeline.
	// A short node-monitor grace, so a long partition (NotReady, tainted) takes seconds, not a minute.
	// The chart's memory limits on the daemons (see TestReportFloodWhileTheBrokerIsAwayStaysWithinTheAgentsLimit).
	s, err = harness.StartSim(context.Background(), harness.SimOptions{CrashBackoff: 10 * time.Second,
		Cluster:          harness.ControlPlaneOptions{NodeMonitorGracePeriod: 20 * time.Second},
		AgentMemoryLimit: 64 << 20, ControllerMemoryLimit: 256 << 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the simulation:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		s.ControlPlane.KeepDir()
		fmt.Fprintf(os.Stderr, "simulation logs (control plane, controller, nodes) kept in %s\n", s.ControlPlane.Dir)
	}
	s.Stop()
	os.Exit(code)
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: needs the simulation (run without -short)")
	}
}

// apply creates every object of one of Lifeline's examples in the default namespace, its placeholders set to the
// simulation's nodes, as `envsubst < deploy/examples/<file> | kubectl apply -f -` would: the Models and Datasets
// (left as they are when an earlier test made them), then the service or job, edited, which it returns.
func apply(t testing.TB, file string, edits ...func(client.Object)) client.Object {
	t.Helper()
	ctx := context.Background()
	objs, err := testkit.Objects(file, harness.FixtureVars)
	if err != nil {
		t.Fatal(err)
	}
	var main client.Object
	for _, obj := range objs {
		obj.SetNamespace("default")
		switch obj.(type) {
		case *v1alpha1.JointInferenceService, *v1alpha1.FederatedLearningJob:
			main = obj
			continue
		}
		if err := s.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %s %s of %s: %v", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), file, err)
		}
	}
	if main == nil {
		t.Fatalf("example %s holds no service or job", file)
	}
	for _, edit := range edits {
		edit(main)
	}
	_, isJob := main.(*v1alpha1.FederatedLearningJob)
	if isJob {
		waitAggregationPortFree(t)
	}
	if err := s.Client.Create(ctx, main); err != nil {
		t.Fatal(err)
	}
	if isJob {
		// JI tests go on with the service a previous one made; jobs end with their test.
		t.Cleanup(func() { deleteAndWait(t, main.DeepCopyObject().(client.Object)) })
	}
	return main
}

// waitAggregationPortFree waits until no earlier job's aggregator holds the aggregation port: the cloud node's
// pods share the host's ports, and an aggregator still finishing (it answers "done" for 3 s before it exits)
// would tell this job's trainers that the training is over.
func waitAggregationPortFree(t testing.TB) {
	t.Helper()
	addr := net.JoinHostPort("", strconv.Itoa(fl.AggregationPort))
	testkit.Every(t, 100*time.Millisecond, within, fmt.Sprintf("port %d free of an earlier job's aggregator", fl.AggregationPort),
		func(context.Context) (bool, error) {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return false, err
			}
			return true, l.Close()
		})
}

// deleteAndWait deletes a job in the foreground and waits until it is gone, and so its pods (a hollow
// node removes a pod once its processes are stopped): the next test's workers must not meet this one's, which
// share the cloud node's host ports. apply has it run for a job when its test ends.
func deleteAndWait(t testing.TB, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	if err := s.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		if !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s: %v", obj.GetName(), err)
		}
		return
	}
	key := client.ObjectKeyFromObject(obj)
	eventually(t, time.Minute, obj.GetName()+" gone after its deletion", func(ctx context.Context) (bool, error) {
		err := s.Client.Get(ctx, key, obj)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// controllerCount is a counter of the controller's metrics endpoint, summed over the samples whose labels
// contain match.
func controllerCount(t testing.TB, name, match string) float64 {
	t.Helper()
	v, err := s.ControllerMetric(name, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitCount waits until a counter of the controller (see controllerCount) has reached at least want, and
// returns its value then.
func waitCount(t testing.TB, name, match string, want float64, what string) float64 {
	t.Helper()
	var now float64
	testkit.UntilErr(t, within, what, func(context.Context) (bool, error) {
		v, err := s.ControllerMetric(name, match)
		now = v
		if err == nil && v < want {
			err = fmt.Errorf("%s{%s} at %v, want %v", name, match, v, want)
		}
		return err == nil, err
	})
	return now
}

// heard is how many messages of kind the controller has taken from the agents so far.
func heard(t testing.TB, kind lifelinev1.Kind) float64 {
	t.Helper()
	return controllerCount(t, "lifeline_liveness_messages_total", `kind="`+kind.String()+`"`)
}

// waitHeard waits until the controller has taken more messages of kind than from, and returns how many then.
func waitHeard(t testing.TB, kind lifelinev1.Kind, from float64, what string) float64 {
	t.Helper()
	return waitCount(t, "lifeline_liveness_messages_total", `kind="`+kind.String()+`"`, from+1, what)
}

// edgeAgents is how many agents the simulation runs, one on each edge node.
const edgeAgents = 3

// waitAgentsBeat waits until the controller has taken n heartbeats of each edge agent's worth more than from: n
// heartbeat intervals of the agents. Each beats once an interval whatever else it does, so their heartbeats are
// a clock of the agents' own, as the controller hears it: for a wait that must outlast a timer inside an agent,
// which tells nothing outside when it runs out without acting.
func waitAgentsBeat(t testing.TB, from float64, n int, what string) {
	t.Helper()
	waitCount(t, "lifeline_liveness_messages_total", `kind="`+lifelinev1.KindHeartbeat.String()+`"`, from+float64(n*edgeAgents), what)
}

// waitReconciled waits until the named controller of lifeline-controller has ended two more reconciles than it
// had when called. With one workload of its kind, reconciled by one worker at a time, the first of them may have
// begun before the call, the second began after: it saw everything the controller knew at the call.
func waitReconciled(t testing.TB, controller, what string) {
	t.Helper()
	match := `controller="` + controller + `"`
	from := controllerCount(t, "controller_runtime_reconcile_total", match)
	waitCount(t, "controller_runtime_reconcile_total", match, from+2, what)
}

func TestJointInferenceServesHardExamplesInTheCloud(t *testing.T) {
	skipShort(t)
	ji := apply(t, "joint-inference.yaml").(*v1alpha1.JointInferenceService)
	eventually(t, within, "the service Ready", func(ctx context.Context) (bool, error) {
		got := &v1alpha1.JointInferenceService{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, jointinference.ConditionReady), nil
	})
	eventually(t, within, "the big model to answer hard examples from the little one", func(ctx context.Context) (bool, error) {
		served, err := bigModelServed()
		if err != nil {
			return false, err
		}
		return served >= 3, nil
	})
	eventually(t, within, "the little model's reports in the service's status.metrics", func(ctx context.Context) (bool, error) {
		got := &v1alpha1.JointInferenceService{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		for _, m := range got.Status.Metrics {
			if m.Key == "inferenceNumber" && m.Value != "0" {
				return true, nil
			}
		}
		return false, nil
	})
}

func bigModelServed() (int, error) {
	resp, err := http.Get("http://127.0.0.1:5000/stats")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var stats struct {
		Served int `json:"served"`
	}
	err = json.NewDecoder(resp.Body).Decode(&stats)
	return stats.Served, err
}

// littleModelPod is the edge worker's pod of the helmet service.
func littleModelPod(t testing.TB) *corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := s.Client.List(context.Background(), pods, client.InNamespace("default"),
		client.MatchingLabels{"lifeline.sedna.io/role": "edge", "jointinferenceservice.sedna.io/name": "helmet-detection-inference-example"}); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	t.Fatal("no edge worker pod")
	return nil
}

func TestKilledWorkerProcessRunsAgain(t *testing.T) {
	skipShort(t)
	pod := littleModelPod(t)
	if err := s.KillWorker("edge3", "default", pod.Name, "little-model"); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "the little model restarted by its node", func(ctx context.Context) (bool, error) {
		got := &corev1.Pod{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
			return false, err
		}
		cs := got.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1 && cs[0].State.Running != nil &&
			s.WorkerRunning("edge3", "default", pod.Name, "little-model"), nil
	})
}

func TestRestartedEdgeNodeBringsItsWorkersBack(t *testing.T) {
	skipShort(t)
	pod := littleModelPod(t)
	if err := s.RestartNode("edge3"); err != nil {
		t.Fatal(err)
	}
	restarts := pod.Status.ContainerStatuses[0].RestartCount
	eventually(t, within, "the little model running again after the node restart, its restart counted", func(ctx context.Context) (bool, error) {
		got := &corev1.Pod{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
			return false, err
		}
		cs := got.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount == restarts+1 && s.WorkerRunning("edge3", "default", pod.Name, "little-model"), nil
	})
	before, _ := bigModelServed()
	eventually(t, within, "hard examples flowing again", func(ctx context.Context) (bool, error) {
		now, err := bigModelServed()
		return err == nil && now > before, err
	})
}

func TestDeletingTheServiceStopsEveryWorkerProcess(t *testing.T) {
	skipShort(t)
	pod := littleModelPod(t)
	ji := &v1alpha1.JointInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "helmet-detection-inference-example"}}
	if err := s.Client.Delete(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "the workers' processes gone", func(ctx context.Context) (bool, error) {
		_, err := bigModelServed()
		return err != nil && !s.WorkerRunning("edge3", "default", pod.Name, "little-model"), nil
	})
}

func TestFederatedLearningRunsToComplete(t *testing.T) {
	skipShort(t)
	job := apply(t, "federated-learning.yaml").(*v1alpha1.FederatedLearningJob)
	eventually(t, 2*within, "the job Complete", func(ctx context.Context) (bool, error) {
		got := &v1alpha1.FederatedLearningJob{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return false, err
		}
		if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.FLConditionFailed) {
			return false, fmt.Errorf("job failed: %+v", got.Status.Conditions)
		}
		return got.Status.Phase == v1alpha1.FLJobSucceeded, nil
	})
	eventually(t, within, "the trainers' reports in status.progress", func(ctx context.Context) (bool, error) {
		got := &v1alpha1.FederatedLearningJob{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return false, err
		}
		p := got.Status.Progress
		return p != nil && p.Round == 3 && len(p.Metrics) > 0, nil // the example's exit_round
	})
	eventually(t, within, "the trainers' saved model's metrics in the output Model's status", func(ctx context.Context) (bool, error) {
		model := &v1alpha1.Model{}
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: job.Spec.AggregationWorker.Model.Name}, model); err != nil {
			return false, err
		}
		for _, m := range model.Status.Metrics {
			if m.Key == "loss" && model.Status.UpdateTime != nil {
				return true, nil
			}
		}
		return false, fmt.Errorf("model status %+v", model.Status)
	})
}

func TestDeletedTrainerComesBackWithItsWorkerName(t *testing.T) {
	skipShort(t)
	// Many rounds, so the job is still training when its trainer is deleted.
	job := apply(t, "federated-learning.yaml",
		func(o client.Object) {
			o.(*v1alpha1.FederatedLearningJob).Spec.AggregationWorker.Template.Spec.Containers[0].Env =
				[]corev1.EnvVar{{Name: "exit_round", Value: "100000"}}
		}).(*v1alpha1.FederatedLearningJob)
	name := fl.TrainerName(job.GetName(), 0)
	var old *corev1.Pod
	eventually(t, within, "trainer 0 running", func(ctx context.Context) (bool, error) {
		old = &corev1.Pod{}
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, old); err != nil {
			return false, err
		}
		return old.Status.Phase == corev1.PodRunning, nil
	})
	if err := s.Client.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "trainer 0 back under its name", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{}
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, p); err != nil {
			return false, err
		}
		if p.UID == old.UID {
			return false, nil
		}
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == "WORKER_NAME" && e.Value != name {
				return false, fmt.Errorf("WORKER_NAME %q", e.Value)
			}
		}
		return p.Status.Phase == corev1.PodRunning && s.WorkerRunning("edge1", "default", name, "train-worker"), nil
	})
	if err := s.Client.Delete(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "every worker process of the job gone", func(ctx context.Context) (bool, error) {
		for _, n := range []string{"cloud", "edge1", "edge2"} {
			for _, w := range []string{fl.AggregatorName(job.GetName()), fl.TrainerName(job.GetName(), 0), fl.TrainerName(job.GetName(), 1)} {
				if s.WorkerRunning(n, "default", w, "train-worker") || s.WorkerRunning(n, "default", w, "agg-worker") {
					return false, fmt.Errorf("%s still runs on %s", w, n)
				}
			}
		}
		return true, nil
	})
}
