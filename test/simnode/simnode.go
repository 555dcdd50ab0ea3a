package simnode

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Register creates the Node (if missing) with labels and a generous capacity, and reports it Ready.
func Register(ctx context.Context, client kubernetes.Interface, name string, labels map[string]string, lease time.Duration) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
			corev1.ResourcePods: resource.MustParse("250"),
		}},
	}
	node.Status.Allocatable = node.Status.Capacity
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering node %s: %w", name, err)
	}
	return Heartbeat(ctx, client, name, lease)
}

// Heartbeat reports the node Ready and renews its Lease once.
func Heartbeat(ctx context.Context, client kubernetes.Interface, name string, lease time.Duration) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		transition := now
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				transition = c.LastTransitionTime
			}
		}
		// The kubelet (and edged, which patches its Node) sets its own conditions and keeps the others', such as
		// node-problem-detector's or Lifeline's LifelineAgent.
		ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated node is ready", LastHeartbeatTime: now, LastTransitionTime: transition}
		kept := node.Status.Conditions[:0]
		for _, c := range node.Status.Conditions {
			if c.Type != corev1.NodeReady {
				kept = append(kept, c)
			}
		}
		node.Status.Conditions = append(kept, ready)
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}}
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("reporting node %s ready: %w", name, err)
	}
	return renewLease(ctx, client, name, lease)
}

func renewLease(ctx context.Context, client kubernetes.Interface, name string, duration time.Duration) error {
	leases := client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name),
				LeaseDurationSeconds: ptr.To(int32(duration / time.Second)), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return fmt.Errorf("reading lease of %s: %w", name, err)
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// KeepAlive heartbeats every interval until ctx ends; failures (a cut link) are retried at the next tick.
func KeepAlive(ctx context.Context, client kubernetes.Interface, name string, interval, lease time.Duration) {
	KeepAliveWhile(ctx, client, name, interval, lease, nil)
}

// KeepAliveWhile is KeepAlive skipping the ticks at which linked (when given) says the node cannot reach the cloud
// (an edge node's edgehub disconnected).
func KeepAliveWhile(ctx context.Context, client kubernetes.Interface, name string, interval, lease time.Duration, linked func() bool) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if linked == nil || linked() {
				_ = Heartbeat(ctx, client, name, lease)
			}
		}
	}
}
