package jointinference_test

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/test/harness"
)

const recreations = 100

// BenchmarkChildRecreation measures how long a deleted child takes to come back: Lifeline re-creating a JI's edge
// Deployment, beside the anchor of kube-controller-manager's Deployment controller re-creating a deleted
// ReplicaSet, in the same run on the same control plane.
func BenchmarkChildRecreation(b *testing.B) {
	harness.SkipIfShort(b)
	ji := createService(b, "joint-inference.yaml")
	waitReady(b, ji)
	deployments := env.Kube.AppsV1().Deployments(ji.Namespace)
	edge := jointinference.DeploymentName(ji.Name, "edge")
	lifeline := harness.MeasureRecreations(b, recreations, harness.Recreatable{
		Name: edge,
		Current: func(ctx context.Context) (types.UID, string, error) {
			d, err := deployments.Get(ctx, edge, metav1.GetOptions{})
			if err != nil {
				return "", "", err
			}
			return d.UID, d.ResourceVersion, nil
		},
		Watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return deployments.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		},
		Delete: func(ctx context.Context) error { return deployments.Delete(ctx, edge, metav1.DeleteOptions{}) },
	})

	replicaSets := env.Kube.AppsV1().ReplicaSets(ji.Namespace)
	createAnchorDeployment(b, ji.Namespace)
	anchorRS := func(ctx context.Context) (*appsv1.ReplicaSet, string, error) {
		list, err := replicaSets.List(ctx, metav1.ListOptions{LabelSelector: "app=anchor"})
		if err != nil || len(list.Items) != 1 {
			return nil, "", fmt.Errorf("anchor has %d ReplicaSets (%v)", len(list.Items), err)
		}
		return &list.Items[0], list.ResourceVersion, nil
	}
	anchor := harness.MeasureRecreations(b, recreations, harness.Recreatable{
		Current: func(ctx context.Context) (types.UID, string, error) {
			rs, rv, err := anchorRS(ctx)
			if err != nil {
				return "", "", err
			}
			return rs.UID, rv, nil
		},
		Watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return replicaSets.Watch(ctx, metav1.ListOptions{LabelSelector: "app=anchor", ResourceVersion: rv})
		},
		Delete: func(ctx context.Context) error {
			rs, _, err := anchorRS(ctx)
			if err != nil {
				return err
			}
			return replicaSets.Delete(ctx, rs.Name, metav1.DeleteOptions{})
		},
	})
	harness.ReportComparison(b, "JI child re-creation (delete -> replacement seen by a watch)",
		"JI edge Deployment", lifeline, "Deployment controller, ReplicaSet", anchor)
}

// createAnchorDeployment makes a plain Deployment whose ReplicaSet the anchor deletes.
func createAnchorDeployment(b *testing.B, ns string) {
	labels := map[string]string{"app": "anchor"}
	_, err := env.Kube.AppsV1().Deployments(ns).Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "anchor"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{NodeName: "cloud-node", Containers: []corev1.Container{{Name: "c", Image: "anchor:1"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
}
