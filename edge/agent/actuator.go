package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/lifeline-edge/lifeline/edge/cri"
)

// CRIActuator restarts a worker by stopping its containers through the runtime: the node's kubelet (edged)
// starts them again by the pod's restart policy, even while the node cannot reach the API server.
type CRIActuator struct {
	Runtime interface {
		Pods(ctx context.Context) ([]cri.Pod, error)
		StopContainer(ctx context.Context, id string, grace time.Duration) error
	}
	// Grace is the containers' stop grace period (default 10 s).
	Grace time.Duration
}

// Restart stops every running container of the pod with that UID.
func (a *CRIActuator) Restart(ctx context.Context, namespace, pod, uid string) error {
	pods, err := a.Runtime.Pods(ctx)
	if err != nil {
		return err
	}
	grace := a.Grace
	if grace == 0 {
		grace = 10 * time.Second
	}
	for _, p := range pods {
		if p.UID != uid {
			continue
		}
		for _, c := range p.Containers {
			if c.Running {
				if err := a.Runtime.StopContainer(ctx, c.ID, grace); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return fmt.Errorf("pod %s/%s (%s) has no containers in the runtime", namespace, pod, uid)
}
