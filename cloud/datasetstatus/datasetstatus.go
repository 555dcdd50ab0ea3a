// Package datasetstatus writes Dataset.status.numberOfSamples from what the edge agent of the Dataset's node
// counted in its index file, as Sedna's local controller reports it to its GM.
package datasetstatus

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// Reconciler patches a Dataset's status when its node's agent counted a new number of samples.
type Reconciler struct {
	client.Client
	// Edge is the agents' view; without it nothing is ever counted.
	Edge *edgeaware.Edge
}

// Reconcile writes the latest count of one Dataset, when it differs from the status. The tracker accepted it
// only from the Dataset's own node.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	count, counted := r.Edge.DatasetSamples(req.Namespace, req.Name)
	if !counted {
		return ctrl.Result{}, nil
	}
	ds := &v1alpha1.Dataset{}
	if err := r.Get(ctx, req.NamespacedName, ds); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading dataset %s: %w", req.Name, err)
	}
	if int64(ds.Status.NumberOfSamples) == count.Samples && ds.Status.UpdateTime != nil {
		return ctrl.Result{}, nil
	}
	base := ds.DeepCopy()
	at := metav1.NewTime(count.At.Truncate(time.Second))
	ds.Status.NumberOfSamples, ds.Status.UpdateTime = int(count.Samples), &at
	if err := r.Status().Patch(ctx, ds, client.MergeFrom(base)); err != nil {
		return ctrl.Result{}, fmt.Errorf("writing the status of dataset %s: %w", req.Name, err)
	}
	log.FromContext(ctx).V(2).Info("counted the dataset's samples", "samples", count.Samples)
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller; it runs only edge-aware, woken by the agents' counts.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	noPods := func(context.Context, client.Object) []reconcile.Request { return nil }
	src := r.Edge.Source(mgr.GetClient(), noPods, liveness.DatasetKind)
	if src == nil {
		return nil
	}
	return ctrl.NewControllerManagedBy(mgr).Named("datasetstatus").WatchesRawSource(src).Complete(r)
}
