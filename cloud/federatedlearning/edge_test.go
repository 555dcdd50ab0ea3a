package federatedlearning_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// runEdgeAware runs this package's reconciler edge-aware, in place of the shared controller, for one test.
func runEdgeAware(t *testing.T) *harness.EdgeAware {
	t.Helper()
	return env.RunEdgeAware(t, func(mgr ctrl.Manager, e *edgeaware.Edge) error {
		r := &fl.Reconciler{Deps: workload.Deps{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("lifeline-controller"),
			LCServer: contract.DefaultLCServer, Edge: e}}
		return r.SetupWithManager(env.CountPasses(mgr))
	})
}

// startJobOn creates the example job in ns whose first trainer is pinned to node, and returns that trainer's pod.
func startJobOn(t *testing.T, ns, node string) (*v1alpha1.FederatedLearningJob, *corev1.Pod) {
	t.Helper()
	job := loadJob(t, "federated-learning.yaml", ns)
	job.Spec.TrainingWorkers[0].Template.Spec.NodeName = node
	if err := env.Client.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	var trainer *corev1.Pod
	eventually(t, within, "the trainer on "+node, func(context.Context) (bool, error) {
		trainer = workerPods(t, job)[fl.TrainerName(job.Name, 0)]
		return trainer != nil, nil
	})
	return job, trainer
}

// TestNodeBackFromACutReMergesTheStatus: a node that turns Ready again makes the API server its trainer's truth
// again, though no pod changes — the kubelet of a node back from a cut may post no new pod status at all. The
// job's status must follow the Node, or the trainer stays Unknown for good.
func TestNodeBackFromACutReMergesTheStatus(t *testing.T) {
	harness.SkipIfShort(t)
	runEdgeAware(t)
	ns := env.NewNamespace(t, "fl")
	node := "cut-" + ns
	env.AddNode(t, node, corev1.ConditionFalse)
	job, trainer := startJobOn(t, ns, node)
	trainer = env.ReportRunning(t, trainer)
	record := func(what string, ok func(v1alpha1.WorkerStatus) bool) {
		t.Helper()
		eventually(t, within, what, func(context.Context) (bool, error) {
			if w := workerRecord(getJob(t, job), trainer.Name); !ok(w) {
				return false, fmt.Errorf("record %+v", w)
			}
			return true, nil
		})
	}
	record("the trainer Unknown while its node is not Ready and its agent silent", func(w v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessUnknown && w.Source == v1alpha1.StatusSourceNone
	})
	before := workerPods(t, job)[trainer.Name].ResourceVersion
	// The passes the controller's own status write woke, and any queued for later (a pod's change waits
	// coalesce.Period), end here: they see the node not Ready, so after the flip only the Node can wake the job.
	env.Passes(t, job, 2)

	env.SetNodeReadiness(t, node, corev1.ConditionTrue)
	record("the trainer Alive from the API server once its node is Ready", func(w v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive && w.Source == v1alpha1.StatusSourceAPIServer
	})
	if after := workerPods(t, job)[trainer.Name].ResourceVersion; after != before {
		t.Errorf("the trainer's pod changed (resourceVersion %s to %s): the test no longer shows a Node alone waking the job", before, after)
	}
}

// TestHealingGoesOnWhenTheStatusCannotBeWritten: a trainer dies on a node cut off from the API server; its job's
// status cannot be written (a report grew it too large, an admission policy refuses it). The agent is still told
// to rebuild the trainer its node lost — a status that cannot be stored must never stop the healing.
func TestHealingGoesOnWhenTheStatusCannotBeWritten(t *testing.T) {
	harness.SkipIfShort(t)
	edge := runEdgeAware(t)
	ns := env.NewNamespace(t, "fl")
	env.RefuseStatusWrites(t, ns, "federatedlearningjobs")
	node := "cut-" + ns
	env.AddNode(t, node, corev1.ConditionFalse)
	job, trainer := startJobOn(t, ns, node)

	edge.AgentCutOff(t, node)
	edge.WorkerLost(t, trainer)
	eventually(t, within, "a rebuild command to the cut-off node", func(context.Context) (bool, error) {
		if edge.RebuildSentTo(trainer) {
			return true, nil
		}
		return false, fmt.Errorf("commands sent: %v", edge.Commands())
	})
	if got := getJob(t, job); len(got.Status.Conditions) != 0 || len(got.Status.Workers) != 0 {
		t.Errorf("a status was written after all (%+v): the test no longer shows healing without it", got.Status)
	}
}
