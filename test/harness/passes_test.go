package harness

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// addOnly is a manager that only takes runnables, for controllers built without a cluster.
type addOnly struct {
	ctrl.Manager
	added []ctrlmanager.Runnable
}

func (m *addOnly) GetControllerOptions() config.Controller {
	return config.Controller{SkipNameValidation: ptr.To(true)}
}

func (m *addOnly) Add(r ctrlmanager.Runnable) error {
	m.added = append(m.added, r)
	return nil
}

// A controller set up through WithReconciled tells the hook of each of its passes, failed ones included, under
// its name; the pass's result and error are the reconciler's own.
func TestWithReconciledTellsOfEveryPass(t *testing.T) {
	type pass struct {
		controller string
		req        reconcile.Request
		err        error
	}
	var told []pass
	base := &addOnly{}
	mgr := WithReconciled(base, func(controller string, req reconcile.Request, err error) {
		told = append(told, pass{controller, req, err})
	})
	failed := errors.New("a failed pass")
	c, err := controller.New("hooked", mgr, controller.Options{Reconciler: reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		if req.Name == "bad" {
			return reconcile.Result{}, failed
		}
		return reconcile.Result{RequeueAfter: time.Minute}, nil
	})})
	if err != nil {
		t.Fatalf("setting up a controller through WithReconciled: %v", err)
	}
	if len(base.added) != 1 || base.added[0] != ctrlmanager.Runnable(c) {
		t.Fatalf("the manager was handed %v, want the controller", base.added)
	}
	good := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "good"}}
	bad := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "bad"}}
	if res, err := c.Reconcile(context.Background(), good); err != nil || res.RequeueAfter != time.Minute {
		t.Errorf("pass over good: %+v, %v; want the reconciler's requeue after a minute", res, err)
	}
	if _, err := c.Reconcile(context.Background(), bad); !errors.Is(err, failed) {
		t.Errorf("pass over bad: %v, want the reconciler's error", err)
	}
	want := []pass{{"hooked", good, nil}, {"hooked", bad, failed}}
	if diff := cmp.Diff(want, told, cmp.AllowUnexported(pass{}), cmpopts.EquateErrors()); diff != "" {
		t.Errorf("passes told (-want +got):\n%s", diff)
	}
}
