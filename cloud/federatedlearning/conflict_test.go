package federatedlearning_test

import (
	"context"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// TestStatusFromAStaleCopyWaitsForTheNewerJob: a pass that decided on a copy of the job older than the API
// server's (a cache behind its watch) has its status write refused as a conflict. It stores nothing and returns
// without an error, since the newer job's arrival wakes the next pass: an error would hold the job back for a
// back-off, which an outage's many conflicts stretch to seconds.
func TestStatusFromAStaleCopyWaitsForTheNewerJob(t *testing.T) {
	mgr := runEdgeAware(t).Manager
	job := startJob(t, "federated-learning.yaml", nil)
	ctx := context.Background()
	var stored *v1alpha1.FederatedLearningJob
	// Settled: every worker running and recorded so, or the running controller's next pass (the one the edit
	// below wakes) would change the status the test compares.
	workers := int32(1 + len(job.Spec.TrainingWorkers))
	eventually(t, within, "every worker running and recorded", func(context.Context) (bool, error) {
		stored = getJob(t, job)
		return len(stored.Status.Workers) == int(workers) && stored.Status.Active == workers && stored.Status.Phase == v1alpha1.FLJobRunning, nil
	})
	// The copy the pass reads: the job before its first status write, at a resourceVersion the API server has
	// since left behind (the annotation below).
	stale := stored.DeepCopy()
	stale.Status = v1alpha1.FederatedLearningJobStatus{}
	if err := env.Client.Patch(ctx, stored, client.RawPatch("application/merge-patch+json",
		[]byte(`{"metadata":{"annotations":{"test.lifeline.io/newer":"yes"}}}`))); err != nil {
		t.Fatal(err)
	}
	stored = getJob(t, job)

	r := &fl.Reconciler{Deps: workload.Deps{Client: harness.Behind{Client: mgr.GetClient(), Copy: stale}, Statuses: harness.StatusWriter(t, mgr)}}
	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(job)})
	if err != nil || !res.IsZero() {
		t.Fatalf("a pass on a stale copy returned (%+v, %v), want nothing to retry: the newer job wakes the next", res, err)
	}
	if after := getJob(t, job); !equality.Semantic.DeepEqual(after.Status, stored.Status) {
		t.Errorf("the stale pass changed the stored status:\n got %+v\nwant %+v", after.Status, stored.Status)
	}
}

// listCounter is a reader past the cache that counts the lists made through it.
type listCounter struct {
	client.Reader
	lists atomic.Int32
}

func (c *listCounter) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.lists.Add(1)
	return c.Reader.List(ctx, list, opts...)
}

// TestAJobWithAPodForEveryWorkerListsNothingPastTheCache: the passes a new job's own pod creations wake may read
// the job still without its first status, as a cache behind its watch shows it. With a pod under every worker's
// name there is nothing of Sedna's GM left to adopt, so no pod is listed past the cache (at a thousand new jobs
// that was thousands of lists, each of every pod in the namespace).
func TestAJobWithAPodForEveryWorkerListsNothingPastTheCache(t *testing.T) {
	mgr := runEdgeAware(t).Manager
	job := startJob(t, "federated-learning.yaml", nil)
	workers := 1 + len(job.Spec.TrainingWorkers)
	var stored *v1alpha1.FederatedLearningJob
	eventually(t, within, "every worker's pod made and recorded", func(context.Context) (bool, error) {
		stored = getJob(t, job)
		return len(stored.Status.Workers) == workers, nil
	})
	stale := stored.DeepCopy()
	stale.Status = v1alpha1.FederatedLearningJobStatus{}
	uncached := &listCounter{Reader: env.Client}
	r := &fl.Reconciler{Deps: workload.Deps{Client: harness.Behind{Client: mgr.GetClient(), Copy: stale}, APIReader: uncached, Statuses: harness.StatusWriter(t, mgr)}}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(job)}); err != nil {
		t.Fatal(err)
	}
	if n := uncached.lists.Load(); n != 0 {
		t.Errorf("%d lists past the cache for a job whose every worker has its pod", n)
	}
}
