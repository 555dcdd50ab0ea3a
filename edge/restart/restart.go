// Package restart restarts a worker on the node (ACTION_RESTART): it stops the worker's containers, through
// KubeEdge's MetaServer or the container runtime, and the node starts them again by the pod's restart policy. It
// exists so that how a restart reaches the node is chosen apart from the agent's loop, which only asks for one
// (agent.Actuator).
package restart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/lifeline-edge/lifeline/edge/cri"
)

// Actuator restarts a worker's containers; the node starts them again (agent.Actuator, which FirstWorking is too).
type Actuator interface {
	Restart(ctx context.Context, namespace, pod, uid string) error
}

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

// MetaServerActuator restarts a worker through KubeEdge's MetaServer on the node, the call `keadm ctl restart
// pod` makes, without the API server. The MetaServer only stops the pod's containers: edged starts them again
// under its crash back-off (10 s, 20 s, ...), as after any exit.
type MetaServerActuator struct {
	// BaseURL of the MetaServer, e.g. http://127.0.0.1:10550.
	BaseURL string
	Client  *http.Client
}

// Restart asks the MetaServer to restart the pod. The MetaServer knows pods by name only; the caller fenced
// the UID against the node's desired workers.
func (a *MetaServerActuator) Restart(ctx context.Context, namespace, pod, _ string) error {
	body, _ := json.Marshal([]string{pod})
	url := strings.TrimSuffix(a.BaseURL, "/") + "/api/v1/namespaces/" + namespace + "/pods/restart"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	client := a.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("MetaServer restart of %s/%s: %w", namespace, pod, err)
	}
	defer resp.Body.Close()
	var answer struct {
		ErrMessages []string `json:"errMessages"`
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("MetaServer restart of %s/%s: %s", namespace, pod, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&answer); err != nil {
		return fmt.Errorf("MetaServer restart of %s/%s: decoding the answer: %w", namespace, pod, err)
	}
	if len(answer.ErrMessages) > 0 {
		return fmt.Errorf("MetaServer restart of %s/%s: %s", namespace, pod, strings.Join(answer.ErrMessages, "; "))
	}
	return nil
}

// FirstWorking tries its actuators in order until one succeeds: MetaServer first (what KubeEdge offers for it),
// then the runtime (the same stop, needing nothing but the CRI socket).
type FirstWorking []Actuator

// Restart returns nil as soon as one actuator restarted the worker, or every actuator's error.
func (f FirstWorking) Restart(ctx context.Context, namespace, pod, uid string) error {
	var errs []error
	for _, a := range f {
		err := a.Restart(ctx, namespace, pod, uid)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
