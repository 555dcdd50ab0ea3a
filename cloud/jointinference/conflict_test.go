package jointinference_test

import (
	"context"
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// TestStatusFromAStaleCopyWaitsForTheNewerService: a pass that decided on a copy of the service older than the
// API server's (a cache behind its watch) has its status write refused. It stores nothing, so an older status
// never overwrites a newer one, and returns without an error: the newer service's arrival wakes the next pass.
func TestStatusFromAStaleCopyWaitsForTheNewerService(t *testing.T) {
	mgr := runEdgeAware(t).Manager
	ji := waitReady(t, createService(t, "joint-inference.yaml"))
	ctx := context.Background()
	// The copy the pass reads: the service before its first status write, at a resourceVersion the API server
	// has since left behind (the annotation below).
	stale := ji.DeepCopy()
	stale.Status = v1alpha1.JointInferenceServiceStatus{}
	if err := env.Client.Patch(ctx, ji, client.RawPatch("application/merge-patch+json",
		[]byte(`{"metadata":{"annotations":{"test.lifeline.io/newer":"yes"}}}`))); err != nil {
		t.Fatal(err)
	}
	stored := &v1alpha1.JointInferenceService{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), stored); err != nil {
		t.Fatal(err)
	}

	r := &jointinference.Reconciler{Deps: workload.Deps{Client: harness.Behind{Client: mgr.GetClient(), Copy: stale}, Statuses: harness.StatusWriter(t, mgr)}}
	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(ji)})
	if err != nil || !res.IsZero() {
		t.Fatalf("a pass on a stale copy returned (%+v, %v), want nothing to retry: the newer service wakes the next", res, err)
	}
	after := &v1alpha1.JointInferenceService{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ji), after); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(after.Status, stored.Status) {
		t.Errorf("the stale pass changed the stored status:\n got %+v\nwant %+v", after.Status, stored.Status)
	}
}

// TestStatusWritesLeaveTheRestAsItWas: a status write sends the status alone (workload.StatusWriteMeta); the API
// server keeps the service's spec, labels and annotations as they were, and the controller's status writes own
// no field beyond the status.
func TestStatusWritesLeaveTheRestAsItWas(t *testing.T) {
	runEdgeAware(t)
	created := createService(t, "joint-inference.yaml")
	ready := waitReady(t, created)
	stored := &v1alpha1.JointInferenceService{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(created), stored); err != nil {
		t.Fatal(err)
	}
	if stored.Status.StartTime == nil || stored.ResourceVersion == created.ResourceVersion {
		t.Fatalf("no status was written: %+v", ready.Status)
	}
	if !equality.Semantic.DeepEqual(stored.Spec, created.Spec) {
		t.Errorf("the spec changed with the status writes:\n got %+v\nwant %+v", stored.Spec, created.Spec)
	}
	if !equality.Semantic.DeepEqual(stored.Labels, created.Labels) || !equality.Semantic.DeepEqual(stored.Annotations, created.Annotations) {
		t.Errorf("labels %v, annotations %v; want %v, %v", stored.Labels, stored.Annotations, created.Labels, created.Annotations)
	}
	statusWrites := 0
	for _, m := range stored.ManagedFields {
		if m.Subresource != "status" {
			continue
		}
		statusWrites++
		var owned map[string]any
		if err := json.Unmarshal(m.FieldsV1.GetRawBytes(), &owned); err != nil {
			t.Fatal(err)
		}
		for field := range owned {
			if field != "f:status" {
				t.Errorf("%s's status writes own %s", m.Manager, field)
			}
		}
	}
	if statusWrites == 0 {
		t.Errorf("no manager of the status among %+v", stored.ManagedFields)
	}
}
