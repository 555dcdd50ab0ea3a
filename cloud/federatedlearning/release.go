package federatedlearning

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
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

// StopDeployment scales the Deployment key to zero and waits, up to timeout, until none of its pods is left: the
// step before ReleaseFinalizers when the controller runs in the cluster, since a running controller would give
// the workers it creates meanwhile the finalizer again. A Deployment that does not exist is already stopped.
func StopDeployment(ctx context.Context, c client.Client, key types.NamespacedName, timeout time.Duration) error {
	deploy := &appsv1.Deployment{}
	// Read again on a conflict: the Deployment controller writes the object as its pods come and go.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, deploy); err != nil {
			return err
		}
		if deploy.Spec.Replicas != nil && *deploy.Spec.Replicas == 0 {
			return nil
		}
		deploy.Spec.Replicas = ptr.To[int32](0)
		return c.Update(ctx, deploy)
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("scaling deployment %s to zero: %w", key, err)
	}
	selector, err := metav1.LabelSelectorAsSelector(deploy.Spec.Selector)
	if err != nil {
		return fmt.Errorf("deployment %s: selector: %w", key, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
			return false, err
		}
		return len(pods.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the pods of deployment %s to end: %w", key, err)
	}
	return nil
}
