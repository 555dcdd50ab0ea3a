package datasetstatus_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/datasetstatus"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/reportapi"
	"github.com/lifeline-edge/lifeline/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func(e *harness.Env) { env = e }))
}

type counterSeq struct{ n uint64 }

func (s *counterSeq) NextCounter(string) (uint64, error) { s.n++; return s.n, nil }

type sinkFunc func(journal.Entry) error

func (f sinkFunc) Enqueue(e journal.Entry) error { return f(e) }

// agentCounter is a node agent's Dataset counter whose counts go straight into the controller's tracker.
func agentCounter(t *testing.T, ea *harness.EdgeAware, node, ns, dataset, index string) *reportapi.DatasetCounter {
	return &reportapi.DatasetCounter{Cluster: harness.EdgeCluster, Node: node, BirthSeq: func() uint64 { return 1 },
		Counter: &counterSeq{}, Log: logr.Discard(),
		Sink: sinkFunc(func(e journal.Entry) error { ea.Tracker.Ingest(e.Topic, e.Payload, time.Now()); return nil }),
		Workers: func() []desired.Worker {
			// The trainer mounts its Dataset's node directory, as the controller renders it: the only files the
			// agent counts.
			return []desired.Worker{{Namespace: ns, Name: "job-trainworker-0", Dataset: dataset, DatasetIndex: index, DatasetFormat: "txt",
				Manifest: `{"spec":{"volumes":[{"name":"d","hostPath":{"path":"` + filepath.Dir(index) + `"}}]}}`}}
		}}
}

// TestDatasetSamplesCountedOnItsNodeReachTheStatus: the agent of a Dataset's node counts its index file as
// Sedna's LC does, and the count becomes the Dataset's status.numberOfSamples; another node's word on it is
// dropped [P-DS-2].
func TestDatasetSamplesCountedOnItsNodeReachTheStatus(t *testing.T) {
	harness.SkipIfShort(t)
	ea := env.RunEdgeAware(t, func(mgr ctrl.Manager, e *edgeaware.Edge) error {
		e.Tracker.Datasets = liveness.CacheDatasets{Reader: mgr.GetClient()}
		return (&datasetstatus.Reconciler{Client: mgr.GetClient(), Edge: e}).SetupWithManager(mgr)
	})
	ns := env.NewNamespace(t, "datasets")
	ds := &v1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "d0"},
		Spec: v1alpha1.DatasetSpec{URL: "/data/set0/train.txt", Format: "txt", NodeName: "edge-a"}}
	if err := env.Client.Create(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(t.TempDir(), "train.txt")
	if err := os.WriteFile(index, []byte("a.jpg 1\nb.jpg 0\nc.jpg 1\nd.jpg 0\ne.jpg 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ea.AgentCutOff(t, "edge-a")
	ea.AgentCutOff(t, "edge-b")
	status := func() v1alpha1.DatasetStatus {
		got := &v1alpha1.Dataset{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ds), got); err != nil {
			t.Fatal(err)
		}
		return got.Status
	}

	forger := filepath.Join(t.TempDir(), "forged.txt")
	if err := os.WriteFile(forger, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agentCounter(t, ea, "edge-b", ns, "d0", forger).CountOnce()
	// The count went through the controller's table as CountOnce returned. Each pass over d0 writes the count the
	// table holds for it, and only one the table holds wakes a pass: with none held, no pass can write the
	// forged one, now or later.
	if c, counted := ea.Tracker.DatasetSamples(ns, "d0"); counted {
		t.Fatalf("the table kept another node's count of d0: %+v", c)
	}
	if s := status(); s.NumberOfSamples != 0 || s.UpdateTime != nil {
		t.Fatalf("status %+v from another node's count", s)
	}

	agentCounter(t, ea, "edge-a", ns, "d0", index).CountOnce()
	harness.Eventually(t, 30*time.Second, "numberOfSamples from the node's count", func(context.Context) (bool, error) {
		if s := status(); s.NumberOfSamples != 5 || s.UpdateTime == nil {
			return false, fmt.Errorf("status %+v", s)
		}
		return true, nil
	})
}
