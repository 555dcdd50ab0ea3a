// Package fakekubelet plays the kubelet of a few nodes through the API alone, as upstream controller
// integration tests do: it keeps the nodes Ready and their leases fresh, reports every pod bound to them as
// running and ready, and finishes graceful deletions. It runs no containers.
package fakekubelet

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Kubelet serves a set of nodes until its context ends.
type Kubelet struct {
	client kubernetes.Interface
	nodes  []string

	mu      sync.Mutex
	holding map[types.UID]bool // pods whose status the test drives itself
}

// Start registers the nodes (Ready, with the given labels) and serves them until ctx ends.
func Start(ctx context.Context, client kubernetes.Interface, labels map[string]string, nodes ...string) (*Kubelet, error) {
	k := &Kubelet{client: client, nodes: nodes, holding: map[types.UID]bool{}}
	for _, n := range nodes {
		if err := k.registerNode(ctx, n, labels); err != nil {
			return nil, err
		}
		go k.heartbeat(ctx, n)
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

func (k *Kubelet) registerNode(ctx context.Context, name string, labels map[string]string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
				corev1.ResourcePods: resource.MustParse("250"),
			},
		},
	}
	node.Status.Allocatable = node.Status.Capacity
	if _, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering node %s: %w", name, err)
	}
	return k.reportReady(ctx, name)
}

func (k *Kubelet) reportReady(ctx context.Context, name string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := k.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		node.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		_, err = k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("reporting node %s ready: %w", name, err)
	}
	return k.renewLease(ctx, name)
}

func (k *Kubelet) renewLease(ctx context.Context, name string) error {
	leases := k.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

func (k *Kubelet) heartbeat(ctx context.Context, name string) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = k.reportReady(ctx, name)
		}
	}
}

// servePods watches the pods bound to a node and answers each change, re-listing whenever the watch ends.
func (k *Kubelet) servePods(ctx context.Context, node string) {
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	for ctx.Err() == nil {
		list, err := k.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for i := range list.Items {
			k.answer(ctx, &list.Items[i])
		}
		w, err := k.client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{
			FieldSelector: selector, ResourceVersion: list.ResourceVersion,
		})
		if err != nil {
			continue
		}
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				k.answer(ctx, pod)
			}
		}
		w.Stop()
	}
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
