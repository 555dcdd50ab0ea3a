package realnode

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// ArmedStandInQuiet tells whether a stand-in of the worker whose pod is namespace/worker is armed on node (its gate
// runs, as the node's runtime says) and shows in the API server as stock monitoring must take it: its mirror pod
// Running, not Ready, each of its containers running (at the gate), none waiting or restarted, controlled by its
// Node as a kubelet or edged makes a mirror pod. Nil when so; else why not.
func (c *Cluster) ArmedStandInQuiet(ctx context.Context, namespace, worker, node string) error {
	_, err := c.ArmedStandIn(ctx, namespace, worker, node)
	return err
}

// ArmedStandIn is the mirror pod of the quiet armed stand-in ArmedStandInQuiet looks for.
func (c *Cluster) ArmedStandIn(ctx context.Context, namespace, worker, node string) (*corev1.Pod, error) {
	if gate, err := c.Node(node).GateRunning(ctx, worker); err != nil || !gate {
		return nil, cmp.Or(err, fmt.Errorf("no stand-in of %s/%s runs its gate on %s", namespace, worker, node))
	}
	var errs []error
	for _, name := range lifelinev1.StandInPodsOn(worker, node) {
		p, err := c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		err = quietArmed(p)
		if err == nil {
			return p, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no stand-in pod of %s/%s on %s", namespace, worker, node)
	}
	return nil, errors.Join(errs...)
}

// quietArmed is nil when p is Running, not Ready, its containers running with no restart, and its Node's.
func quietArmed(p *corev1.Pod) error {
	if owner := metav1.GetControllerOf(p); owner == nil || owner.Kind != "Node" || owner.Name != p.Spec.NodeName {
		return fmt.Errorf("controlled by %v, not by its Node (a ReplicaSet whose selector matches may adopt it)", owner)
	}
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("phase %s", p.Status.Phase)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return errors.New("Ready")
		}
	}
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return fmt.Errorf("%d container statuses of %d containers", len(p.Status.ContainerStatuses), len(p.Spec.Containers))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil || cs.RestartCount > 0 {
			return fmt.Errorf("container %s: %+v, %d restarts", cs.Name, cs.State, cs.RestartCount)
		}
	}
	return nil
}
