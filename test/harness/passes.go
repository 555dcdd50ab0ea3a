package harness

import (
	"context"
	"fmt"
	"reflect"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ReconcileHook is told of each pass a controller completed: the controller's name, the object the pass was
// over, and the error the pass returned (nil when it succeeded).
type ReconcileHook func(controller string, req reconcile.Request, err error)

// WithReconciled returns mgr, except that every controller set up through it calls hook at the end of each of
// its passes. controller-runtime has no hook around a pass, and each of Lifeline's controllers builds itself (its
// SetupWithManager), so the one place where the manager meets its reconciler is Add, where the controller is
// handed over before it runs: there the reconciler controller-runtime keeps in the controller's field Do is
// wrapped. A controller whose reconciler cannot be found there is refused, rather than run with passes uncounted.
func WithReconciled(mgr ctrl.Manager, hook ReconcileHook) ctrl.Manager {
	return &hookedManager{Manager: mgr, hook: hook}
}

// hookedManager wraps the reconciler of each controller added to it; everything else is the Manager's.
type hookedManager struct {
	ctrl.Manager
	hook ReconcileHook
}

// Add wraps r's reconciler when r is a controller, then adds r.
func (m *hookedManager) Add(r manager.Runnable) error {
	if c, ok := r.(controller.Controller); ok {
		if err := hookPasses(c, m.hook); err != nil {
			return err
		}
	}
	return m.Manager.Add(r)
}

// hookPasses replaces the reconciler of c, a controller-runtime controller that has not started, by one that
// calls hook after each pass.
func hookPasses(c controller.Controller, hook ReconcileHook) error {
	v := reflect.ValueOf(c)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("hooking the passes of controller %T: not controller-runtime's controller", c)
	}
	name, do := v.Elem().FieldByName("Name"), v.Elem().FieldByName("Do")
	if name.Kind() != reflect.String || !do.IsValid() || !do.CanSet() || do.Type() != reflect.TypeFor[reconcile.Reconciler]() || do.IsNil() {
		return fmt.Errorf("hooking the passes of controller %T: no reconciler in its field Do (has controller-runtime changed?)", c)
	}
	inner := do.Interface().(reconcile.Reconciler)
	do.Set(reflect.ValueOf(reconcile.Reconciler(&hookedReconciler{controller: name.String(), inner: inner, hook: hook})))
	return nil
}

// hookedReconciler is a controller's reconciler that tells hook of each pass.
type hookedReconciler struct {
	controller string
	inner      reconcile.Reconciler
	hook       ReconcileHook
}

func (r *hookedReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := r.inner.Reconcile(ctx, req)
	r.hook(r.controller, req, err)
	return res, err
}
