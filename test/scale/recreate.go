package scale

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/test/harness"
)

// measureDeploymentRecreation deletes a Deployment n times and times each until its replacement is seen. The
// watch starts from a list's resource version, the newest: the Deployment's own may be older than what the API
// server still holds while thousands of pods change around it.
func measureDeploymentRecreation(t testing.TB, kube kubernetes.Interface, ns, name string, n int) []time.Duration {
	deployments := kube.AppsV1().Deployments(ns)
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	return harness.MeasureRecreations(t, n, harness.Recreatable{
		Name: name,
		Current: func(ctx context.Context) (types.UID, string, error) {
			list, err := deployments.List(ctx, metav1.ListOptions{FieldSelector: byName})
			if err != nil || len(list.Items) != 1 {
				return "", "", fmt.Errorf("%d Deployments %s (%v)", len(list.Items), name, err)
			}
			return list.Items[0].UID, list.ResourceVersion, nil
		},
		Watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return deployments.Watch(ctx, metav1.ListOptions{FieldSelector: byName, ResourceVersion: rv})
		},
		Delete: func(ctx context.Context) error { return deployments.Delete(ctx, name, metav1.DeleteOptions{}) },
	})
}

// measureReplicaSetRecreation deletes the ReplicaSet of Deployment name n times and times each until the
// Deployment controller's replacement is seen.
func measureReplicaSetRecreation(t testing.TB, kube kubernetes.Interface, ns, name string, n int) []time.Duration {
	d, err := kube.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	selector := labels.SelectorFromSet(d.Spec.Selector.MatchLabels).String()
	replicaSets := kube.AppsV1().ReplicaSets(ns)
	current := func(ctx context.Context) (types.UID, string, string, error) {
		list, err := replicaSets.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(list.Items) != 1 {
			return "", "", "", fmt.Errorf("deployment %s has %d ReplicaSets (%v)", name, len(list.Items), err)
		}
		return list.Items[0].UID, list.Items[0].Name, list.ResourceVersion, nil
	}
	return harness.MeasureRecreations(t, n, harness.Recreatable{
		Current: func(ctx context.Context) (types.UID, string, error) {
			uid, _, rv, err := current(ctx)
			return uid, rv, err
		},
		Watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return replicaSets.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
		},
		Delete: func(ctx context.Context) error {
			_, rs, _, err := current(ctx)
			if err != nil {
				return err
			}
			return replicaSets.Delete(ctx, rs, metav1.DeleteOptions{})
		},
	})
}
