package federatedlearning

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ReleaseFinalizers removes WorkerFinalizer from every pod of the cluster that carries it, and only that: the
// step before uninstalling Lifeline, after which no controller would remove it and such pods could never be
// deleted. Run it once the controller is stopped, or a pod it creates meanwhile keeps the finalizer. Each removal
// is a JSON patch that first tests the finalizer is still where it was read, so a concurrent change of the pod's
// finalizers is never overwritten (the pod is read again on the next run). c must read from the API server, not
// a cache. It returns how many pods were released.
func ReleaseFinalizers(ctx context.Context, c client.Client) (int, error) {
	released := 0
	opts := []client.ListOption{client.Limit(500)}
	for {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, opts...); err != nil {
			return released, fmt.Errorf("listing pods: %w", err)
		}
		for i := range pods.Items {
			pod := &pods.Items[i]
			for j, f := range pod.Finalizers {
				if f != WorkerFinalizer {
					continue
				}
				path := fmt.Sprintf("/metadata/finalizers/%d", j)
				patch, err := json.Marshal([]map[string]any{
					{"op": "test", "path": path, "value": WorkerFinalizer},
					{"op": "remove", "path": path},
				})
				if err != nil {
					return released, err
				}
				switch err := c.Patch(ctx, pod, client.RawPatch(types.JSONPatchType, patch)); {
				case err == nil:
					released++
				case !apierrors.IsNotFound(err):
					return released, fmt.Errorf("releasing pod %s/%s: %w", pod.Namespace, pod.Name, err)
				}
				break
			}
		}
		if pods.Continue == "" {
			return released, nil
		}
		opts = []client.ListOption{client.Limit(500), client.Continue(pods.Continue)}
	}
}
