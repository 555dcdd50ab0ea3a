package jointinference_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/simnode"
)

// runEdgeAware runs this package's reconciler edge-aware, in place of the shared controller, for one test.
func runEdgeAware(t testing.TB) *harness.EdgeAware {
	t.Helper()
	return env.RunEdgeAware(t, func(mgr ctrl.Manager, edge *edgeaware.Edge) error {
		r := &jointinference.Reconciler{Deps: workload.Deps{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("lifeline-controller"),
			LCServer: contract.DefaultLCServer, Edge: edge}}
		return r.SetupWithManager(env.CountPasses(mgr))
	})
}

// createServiceOn creates the helmet example's service with its edge worker pinned to node.
func createServiceOn(t testing.TB, ns, node string) *v1alpha1.JointInferenceService {
	t.Helper()
	ji := loadJI(t, "joint-inference.yaml", ns)
	ji.Spec.EdgeWorker.Template.Spec.NodeName = node
	createModel(t, ns, ji.Spec.EdgeWorker.Model.Name, "/models/little.pb")
	createModel(t, ns, ji.Spec.CloudWorker.Model.Name, "/models/big.pb")
	if err := env.Client.Create(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	return ji
}

// edgePod waits for the edge worker's pod and returns it.
func edgePod(t testing.TB, ns string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, readyWithin, "the edge worker's pod", func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := env.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{contract.RoleLabel: "edge"}); err != nil {
			return false, err
		}
		if len(pods.Items) != 1 {
			return false, fmt.Errorf("%d edge pods", len(pods.Items))
		}
		pod = &pods.Items[0]
		return true, nil
	})
	return pod
}

// waitWorkerRecord waits until the service's status record of pod satisfies ok.
func waitWorkerRecord(t testing.TB, ji *v1alpha1.JointInferenceService, pod string, what string, ok func(v1alpha1.WorkerStatus) bool) {
	t.Helper()
	eventually(t, reconcileBound, what, func(ctx context.Context) (bool, error) {
		got := &v1alpha1.JointInferenceService{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		for _, w := range got.Status.Workers {
			if w.Name == pod {
				if ok(w) {
					return true, nil
				}
				return false, fmt.Errorf("record %+v", w)
			}
		}
		return false, fmt.Errorf("no record of %s in %+v", pod, got.Status.Workers)
	})
}

// TestNodeBackFromACutReMergesTheStatus: a node that turns Ready again makes the API server its workers' truth
// again, though no pod changes — the kubelet of a node back from a cut may post no new pod status at all. The
// status must follow the Node, or it stays Unknown for good.
func TestNodeBackFromACutReMergesTheStatus(t *testing.T) {
	harness.SkipIfShort(t)
	runEdgeAware(t)
	ns := newNamespace(t)
	node := "cut-" + ns
	env.AddNode(t, node, corev1.ConditionFalse)
	ji := createServiceOn(t, ns, node)
	pod := env.ReportRunning(t, edgePod(t, ns))
	waitWorkerRecord(t, ji, pod.Name, "the edge worker Unknown while its node is not Ready and its agent silent",
		func(w v1alpha1.WorkerStatus) bool {
			return w.Liveness == v1alpha1.LivenessUnknown && w.Source == v1alpha1.StatusSourceNone
		})
	before := &corev1.Pod{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), before); err != nil {
		t.Fatal(err)
	}
	// The passes the controller's own status write woke, and any queued for later (a pod's change waits
	// coalesce.Period), end here: they see the node not Ready, so after the flip only the Node can wake the
	// service.
	env.Passes(t, ji, 2)

	// Back: the node is Ready, and renews its lease from now on so the node lifecycle controller leaves it so.
	if err := simnode.Heartbeat(context.Background(), env.Kube, node, 40*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go simnode.KeepAlive(ctx, env.Kube, node, 5*time.Second, 40*time.Second)
	waitWorkerRecord(t, ji, pod.Name, "the edge worker Alive from the API server once its node is Ready",
		func(w v1alpha1.WorkerStatus) bool {
			return w.Liveness == v1alpha1.LivenessAlive && w.Source == v1alpha1.StatusSourceAPIServer && w.Ready
		})
	after := &corev1.Pod{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the pod changed (resourceVersion %s to %s): the test no longer shows a Node alone waking the service",
			before.ResourceVersion, after.ResourceVersion)
	}
}

// TestHealingGoesOnWhenTheStatusCannotBeWritten: a worker dies on a node cut off from the API server; its
// service's status cannot be written (a report grew it too large, an admission policy refuses it). The agent is
// still told to rebuild the worker its node lost — a status that cannot be stored must never stop the healing.
func TestHealingGoesOnWhenTheStatusCannotBeWritten(t *testing.T) {
	harness.SkipIfShort(t)
	edge := runEdgeAware(t)
	ns := newNamespace(t)
	env.RefuseStatusWrites(t, ns, "jointinferenceservices")
	node := "cut-" + ns
	env.AddNode(t, node, corev1.ConditionFalse)
	ji := createServiceOn(t, ns, node)
	pod := edgePod(t, ns)

	// The agent is heard, says its node is cut off from the API server, and that its node lost the worker.
	edge.AgentCutOff(t, node)
	edge.WorkerLost(t, pod)
	eventually(t, reconcileBound, "a rebuild command to the cut-off node", func(context.Context) (bool, error) {
		if edge.RebuildSentTo(pod) {
			return true, nil
		}
		return false, fmt.Errorf("commands sent: %v", edge.Commands())
	})
	eventually(t, reconcileBound, "a RestartCommandSent event", func(ctx context.Context) (bool, error) {
		evs, err := env.Kube.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == edgeaware.ReasonRestartCommandSent && e.Regarding.Name == ji.Name {
				return true, nil
			}
		}
		return false, nil
	})
	got := &v1alpha1.JointInferenceService{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ji), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 0 || len(got.Status.Workers) != 0 {
		t.Errorf("a status was written after all (%+v): the test no longer shows healing without it", got.Status)
	}
}
