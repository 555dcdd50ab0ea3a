package simnode

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Kubelet serves a set of nodes until its context ends.
type Kubelet struct {
	client kubernetes.Interface
	nodes  []string

	mu      sync.Mutex
	holding map[types.UID]bool // pods whose status the test drives itself
}

// StartKubelet registers the nodes (Ready, with the given labels) and serves them until ctx ends.
func StartKubelet(ctx context.Context, client kubernetes.Interface, labels map[string]string, nodes ...string) (*Kubelet, error) {
	k := &Kubelet{client: client, nodes: nodes, holding: map[types.UID]bool{}}
	for _, n := range nodes {
		if err := Register(ctx, client, n, labels, 40*time.Second); err != nil {
			return nil, err
		}
		go KeepAlive(ctx, client, n, 5*time.Second, 40*time.Second)
		go k.servePods(ctx, n)
	}
	return k, nil
}

// Hold stops the kubelet from touching a pod's status, so a test can set it (e.g. Failed) itself.
func (k *Kubelet) Hold(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.holding[uid] = true
}

func (k *Kubelet) held(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.holding[uid]
}

// servePods watches the pods bound to a node and answers each change, re-listing whenever the watch ends.
func (k *Kubelet) servePods(ctx context.Context, node string) {
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		list, err := k.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return
		}
		for i := range list.Items {
			k.answer(ctx, &list.Items[i])
		}
		w, err := k.client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{
			FieldSelector: selector, ResourceVersion: list.ResourceVersion,
		})
		if err != nil {
			return
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				k.answer(ctx, pod)
			}
		}
	}, 200*time.Millisecond)
}

// answer is the kubelet's reaction to a pod: finish its deletion, or report it running and ready.
func (k *Kubelet) answer(ctx context.Context, pod *corev1.Pod) {
	pods := k.client.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		// Deleting by UID: a same-name replacement may already exist and must not be touched.
		_ = pods.Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		return
	}
	if k.held(pod.UID) || pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodSucceeded ||
		pod.Status.Phase == corev1.PodFailed {
		return
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = "127.0.0.1"
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, _ = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
}
