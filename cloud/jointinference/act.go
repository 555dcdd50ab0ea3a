package jointinference

import (
	"context"
	"errors"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/outcome"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// act makes the children what decide wants, tells of those it created, and asks the agents of cut-off nodes to
// heal the workers they report dead; it returns what the agents' side failed at. A child that cannot be synced
// (done.err) does not stop the agents from healing.
func (r *Reconciler) act(ctx context.Context, ji *v1alpha1.JointInferenceService, p plan, obs observation) (syncOutcome, error) {
	done := r.syncChildren(ctx, ji, p.children)
	r.EventCreated(ji, "Create", done.created)
	events, err := r.Edge.Act(obs.pods(), obs.views, obs.now)
	for _, e := range events {
		r.Eventf(ji, e.RelatedNode(), e.Type, e.Reason, "Heal", "%s", e.Message)
	}
	return done, err
}

// syncOutcome is what syncChildren did and found.
type syncOutcome struct {
	created      []workload.CreatedChild // children this pass created
	conflicts    []string                // children under our names owned by someone else
	removedStale bool                    // a child of an earlier service of the same name was deleted
	serviceOnly  bool                    // the pass created the Service and left the rest to the next pass
	err          error                   // what could not be synced
}

// add merges what another sync did and found into out.
func (out *syncOutcome) add(o syncOutcome) {
	out.created = append(out.created, o.created...)
	out.conflicts = append(out.conflicts, o.conflicts...)
	out.removedStale = out.removedStale || o.removedStale
	out.err = errors.Join(out.err, o.err)
}

// syncChildren syncs the Service, then the Deployments at once, then the HPAs, which name the Deployments. A
// pass that creates the Service stops there, and the Service's creation, which the controller watches, brings
// the next pass: the edge worker dials the Service by name from its first second, and under load a Service's
// creation is the slowest request of a start (the API server allocates cluster IPs one at a time, each
// allocation a write of its own), so a pass that waited for it and then for the Deployments would hold a worker
// of the queue twice as long. Many services started at once thus get their Services first, as a client creating
// their children kind by kind would, and their Deployments after.
func (r *Reconciler) syncChildren(ctx context.Context, ji *v1alpha1.JointInferenceService, want desiredChildren) syncOutcome {
	var out syncOutcome
	out.err = r.syncChild(ctx, ji, want.service, &corev1.Service{}, &out, func(observed client.Object) {
		o := observed.(*corev1.Service)
		o.Spec.Selector = want.service.Spec.Selector
		o.Spec.Ports = want.service.Spec.Ports
	})
	if out.err != nil || len(out.created) > 0 {
		out.serviceOnly = out.err == nil
		return out
	}
	syncs := make([]func(*syncOutcome) error, 0, len(want.deployments))
	for _, d := range want.deployments {
		keepReplicas := d.Spec.Replicas == nil // the HPA owns the count
		syncs = append(syncs, func(out *syncOutcome) error {
			return r.syncChild(ctx, ji, d, &appsv1.Deployment{}, out, func(observed client.Object) {
				o := observed.(*appsv1.Deployment)
				replicas := o.Spec.Replicas
				o.Spec = *d.Spec.DeepCopy()
				if keepReplicas {
					o.Spec.Replicas = replicas
				}
			})
		})
	}
	if out.add(syncAtOnce(syncs)); out.err != nil {
		return out
	}
	for name, h := range want.hpas {
		if h == nil {
			if out.err = r.deleteOwned(ctx, ji, &autoscalingv2.HorizontalPodAutoscaler{}, name); out.err != nil {
				return out
			}
			continue
		}
		out.err = r.syncChild(ctx, ji, h, &autoscalingv2.HorizontalPodAutoscaler{}, &out, func(observed client.Object) {
			observed.(*autoscalingv2.HorizontalPodAutoscaler).Spec = *h.Spec.DeepCopy()
		})
		if out.err != nil {
			return out
		}
	}
	return out
}

// syncAtOnce runs syncs concurrently, each with an outcome of its own, and merges what they found.
func syncAtOnce(syncs []func(*syncOutcome) error) syncOutcome {
	outs := make([]syncOutcome, len(syncs))
	var wg sync.WaitGroup
	for i, s := range syncs {
		wg.Go(func() { outs[i].err = s(&outs[i]) })
	}
	wg.Wait()
	var out syncOutcome
	for _, o := range outs {
		out.add(o)
	}
	return out
}

// syncChild makes one child match desired: create it when absent; update it (through apply, which copies the
// rendered fields onto the observed object) when its rendering changed; delete it when an earlier service of
// the same name left it; leave it alone and report it when someone else owns it.
func (r *Reconciler) syncChild(ctx context.Context, ji *v1alpha1.JointInferenceService, desired, observed client.Object,
	out *syncOutcome, apply func(observed client.Object)) error {
	logger := log.FromContext(ctx)
	kind := desired.GetObjectKind().GroupVersionKind().Kind
	hash := templateHash(desired)
	desired.SetAnnotations(merge(desired.GetAnnotations(), map[string]string{TemplateHashAnnotation: hash}))

	// The cache's child, not a copy, copied below only when it is to change: most passes find it as rendered.
	err := r.Get(ctx, client.ObjectKeyFromObject(desired), observed, client.UnsafeDisableDeepCopy)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Create(ctx, desired); err != nil {
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating %s %s: %w", kind, desired.GetName(), err)
			}
			// The cache holds only Deployments and HPAs with a service's label: one of someone else's under
			// this name is read from the API server, and left alone below. Otherwise the cache is behind.
			if err := r.Uncached().Get(ctx, client.ObjectKeyFromObject(desired), observed); err != nil {
				return fmt.Errorf("creating %s %s: it exists, and reading it: %w", kind, desired.GetName(), err)
			}
			if owner := metav1.GetControllerOf(observed); owner != nil && owner.Kind == Kind && owner.APIVersion == v1alpha1.GroupVersion.String() {
				return fmt.Errorf("creating %s %s: cache is behind: %w", kind, desired.GetName(), err)
			}
			break
		}
		logger.V(2).Info("created child", "kind", kind, "name", desired.GetName())
		out.created = append(out.created, workload.CreatedChild{Kind: kind, Object: desired})
		return nil
	case err != nil:
		return fmt.Errorf("reading %s %s: %w", kind, desired.GetName(), err)
	}

	switch owner := metav1.GetControllerOf(observed); {
	case owner == nil || owner.Kind != Kind || owner.APIVersion != v1alpha1.GroupVersion.String():
		out.conflicts = append(out.conflicts, kind+" "+observed.GetName())
		r.Eventf(ji, observed, corev1.EventTypeWarning, ReasonNameConflict, "Reconcile",
			"%s %s exists and is not owned by this JointInferenceService; leaving it alone", kind, observed.GetName())
		return nil
	case owner.UID != ji.UID:
		// Left by a deleted service of the same name whose garbage collection has not reached it yet.
		uid := observed.GetUID()
		err := r.Delete(ctx, observed, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting stale %s %s: %w", kind, observed.GetName(), err)
		}
		out.removedStale = true
		return nil
	}

	current, ok := observed.GetAnnotations()[TemplateHashAnnotation]
	if ok && current == hash {
		return nil
	}
	observed = observed.DeepCopyObject().(client.Object)
	annotations := observed.GetAnnotations()
	if !ok && kind == "Deployment" {
		// Made by Sedna for this very service: take it over as it runs, without restarting its pods. The next
		// change of the service rolls it into Lifeline's rendering.
		observed.SetAnnotations(merge(annotations, map[string]string{TemplateHashAnnotation: hash}))
		if err := r.Update(ctx, observed); err != nil {
			return fmt.Errorf("adopting %s %s: %w", kind, observed.GetName(), err)
		}
		r.Eventf(ji, observed, corev1.EventTypeNormal, ReasonAdopted, "Adopt", "Adopted %s %s", kind, observed.GetName())
		return nil
	}
	apply(observed)
	observed.SetLabels(merge(observed.GetLabels(), desired.GetLabels()))
	observed.SetAnnotations(merge(annotations, desired.GetAnnotations()))
	if err := r.Update(ctx, observed); err != nil {
		return fmt.Errorf("updating %s %s: %w", kind, observed.GetName(), err)
	}
	logger.V(2).Info("updated child", "kind", kind, "name", observed.GetName())
	r.Eventf(ji, observed, corev1.EventTypeNormal, ReasonSuccessfulUpdate, "Update", "Updated %s %s", kind, observed.GetName())
	return nil
}

// deleteOwned deletes a child this service owns, e.g. an HPA whose spec was removed.
func (r *Reconciler) deleteOwned(ctx context.Context, ji *v1alpha1.JointInferenceService, obj client.Object, name string) error {
	err := r.Get(ctx, types.NamespacedName{Namespace: ji.Namespace, Name: name}, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	if owner := metav1.GetControllerOf(obj); owner == nil || owner.UID != ji.UID {
		return nil
	}
	uid := obj.GetUID()
	deleted, err := outcome.Of(r.Delete(ctx, obj, client.Preconditions{UID: &uid}), apierrors.IsNotFound, apierrors.IsConflict)
	if err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	if deleted {
		r.Eventf(ji, obj, corev1.EventTypeNormal, ReasonSuccessfulDelete, "Delete", "Deleted %s", name)
	}
	return nil
}
