package federatedlearning_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// runReading runs this package's reconciler edge-aware with the tracker checking reports against the cache, as
// the manager wires it.
func runReading(t *testing.T) *harness.EdgeAware {
	t.Helper()
	return env.RunEdgeAware(t, func(mgr ctrl.Manager, e *edgeaware.Edge) error {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, liveness.WorkerNameIndex, liveness.IndexWorkerName); err != nil {
			return err
		}
		e.Tracker.Pods = liveness.CachePods{Reader: mgr.GetClient()}
		r := &fl.Reconciler{Deps: workload.Deps{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("lifeline-controller"),
			LCServer: contract.DefaultLCServer, Edge: e}}
		return r.SetupWithManager(mgr)
	})
}

// TestTrainerReportsFillProgressAndTheOutputModel: a trainer's reports, exactly as Sedna's library sends them
// (ownerKind "default", the round in ownerInfo, the saved model in results), become the job's progress and, as
// Sedna's GM does, the metrics of the aggregation worker's Model.
func TestTrainerReportsFillProgressAndTheOutputModel(t *testing.T) {
	harness.SkipIfShort(t)
	ea := runReading(t)
	ns := env.NewNamespace(t, "flreports")
	node := "edge-" + ns
	env.AddNode(t, node, corev1.ConditionTrue)
	job, trainer := startJobOn(t, ns, node)
	ea.AgentCutOff(t, node) // the agent is heard (born) on the node
	report := func(seq uint64, round int, loss float64) {
		body := fmt.Sprintf(`{"name":%q,"namespace":%q,"ownerName":%q,"ownerKind":"default","kind":"train","status":"running",`+
			`"ownerInfo":{"currentRound":%d,"sampleCount":120,"startTime":"2026-12-01 10:00:00","updateTime":"2026-12-01 10:00:09"},`+
			`"results":[{"format":"pb","url":"/home/data/models/fl/model.pb","metrics":{"loss":%g,"accuracy":[0.5,0.75]}}]}`,
			trainer.Name, ns, job.Name, round, loss)
		ea.Ingest(t, lifelinev1.NodeTopic(harness.EdgeCluster, node, lifelinev1.KindReport),
			&lifelinev1.WorkerReport{Namespace: ns, Worker: trainer.Name, Seq: seq, BirthSeq: 1, Body: []byte(body)})
	}
	report(1, 1, 0.5)
	report(2, 2, 0.25)

	// A report that arrives before the controller's cache knows its worker is dropped (unknown-worker); the
	// worker's next one counts: the trainer reports again, as it does at each round.
	seq := uint64(2)
	eventually(t, within, "round 2 in the job's progress", func(context.Context) (bool, error) {
		p := getJob(t, job).Status.Progress
		if p == nil {
			seq++
			report(seq, 2, 0.25)
		}
		want := []v1alpha1.Metric{{Key: "loss", Value: "0.25"}, {Key: "sampleCount", Value: "120"}}
		if p == nil || p.Round != 2 || cmp.Diff(want, p.Metrics) != "" {
			return false, fmt.Errorf("progress %+v", p)
		}
		return true, nil
	})
	eventually(t, within, "the output Model's metrics", func(ctx context.Context) (bool, error) {
		model := &v1alpha1.Model{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: job.Spec.AggregationWorker.Model.Name}, model); err != nil {
			return false, err
		}
		want := []v1alpha1.Metric{{Key: "accuracy", Value: "[0.5,0.75]"}, {Key: "loss", Value: "0.25"}}
		if model.Status.UpdateTime == nil || cmp.Diff(want, model.Status.Metrics) != "" {
			return false, fmt.Errorf("model status %+v", model.Status)
		}
		return true, nil
	})
}
