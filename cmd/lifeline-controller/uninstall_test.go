package main

import (
	"context"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// [U] A controller that stops while its own Deployment is there (a restart, a rollout) leaves the workers' pods
// their finalizer; one that stops once the Deployment is gone (an uninstall, whether or not anything ran Helm's
// pre-delete hook) takes it off, since no controller would afterwards.
func TestAControllerStoppedByItsUninstallReleasesTheWorkersPods(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	ns := "uninstall"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller-manager here makes the namespace's default service account, which admission wants.
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer-0",
		Finalizers: []string{federatedlearning.WorkerFinalizer}}, Spec: corev1.PodSpec{NodeName: "edge-1",
		Containers: []corev1.Container{{Name: "train", Image: "trainer"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "lifeline-controller"}
	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "lifeline-controller"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	finalized := func() bool {
		t.Helper()
		p, err := kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(p.Finalizers, federatedlearning.WorkerFinalizer)
	}

	releaseIfUninstalled(cp.Config, ns+"/lifeline-controller")
	if !finalized() {
		t.Fatal("a controller stopped while its Deployment is there released the workers' pods")
	}
	if err := kube.AppsV1().Deployments(ns).Delete(ctx, "lifeline-controller", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	releaseIfUninstalled(cp.Config, ns+"/lifeline-controller")
	if finalized() {
		t.Error("a controller stopped by its uninstall left the workers' pods their finalizer")
	}
}
