// Package nodewatch wakes a workload controller when a Node its workers are bound to turns Ready or stops being
// Ready. Whose word a worker's status takes depends on it (docs/edge-awareness.md), and nothing else changes when
// it flips: a node back from a cut may post no new pod status at all.
package nodewatch

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Manager is what Watch needs of a controller manager.
type Manager interface {
	GetFieldIndexer() client.FieldIndexer
	GetClient() client.Client
}

// Watch adds to b a watch of Nodes that enqueues, when a Node appears, goes, or its Ready condition changes (not
// on its heartbeats), the workloads podOwner maps the Node's pods to. It registers a cache index of those pods
// by node under index, a name unique to the calling controller.
func Watch(ctx context.Context, mgr Manager, b *builder.Builder, index string, podOwner handler.MapFunc) (*builder.Builder, error) {
	err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, index, func(o client.Object) []string {
		pod := o.(*corev1.Pod)
		if pod.Spec.NodeName == "" || len(podOwner(ctx, pod)) == 0 {
			return nil
		}
		return []string{pod.Spec.NodeName}
	})
	if err != nil {
		return nil, fmt.Errorf("indexing pods by node for %s: %w", index, err)
	}
	pods := mgr.GetClient()
	toWorkloads := func(ctx context.Context, node client.Object) []reconcile.Request {
		list := &corev1.PodList{}
		if err := pods.List(ctx, list, client.MatchingFields{index: node.GetName()}); err != nil {
			return nil
		}
		seen := map[reconcile.Request]bool{}
		var reqs []reconcile.Request
		for i := range list.Items {
			for _, req := range podOwner(ctx, &list.Items[i]) {
				if !seen[req] {
					seen[req] = true
					reqs = append(reqs, req)
				}
			}
		}
		return reqs
	}
	return b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(toWorkloads), builder.WithPredicates(ReadinessChanged)), nil
}

// ReadinessChanged passes a Node's creation and deletion, and an update only when the status of its Ready
// condition changed: a node's heartbeats update it every few seconds and change nothing a workload shows.
var ReadinessChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, isNode := e.ObjectOld.(*corev1.Node)
		updated, isNodeToo := e.ObjectNew.(*corev1.Node)
		return !isNode || !isNodeToo || Readiness(old) != Readiness(updated)
	},
}

// Readiness is the status of a Node's Ready condition; "" when it has none.
func Readiness(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}
