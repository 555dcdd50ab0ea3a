package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

const edgeNode = "edge3" // where the fixture puts the JI edge worker

// readyService applies the helmet JI and waits until it is Ready and its little model runs.
func readyService(t *testing.T) (*v1alpha1.JointInferenceService, *corev1.Pod) {
	t.Helper()
	ji := apply(t, "helmet_detection_inference.yaml",
		[]string{"helmet-detection-inference-little-model", "helmet-detection-inference-big-model"}, nil).(*v1alpha1.JointInferenceService)
	t.Cleanup(func() {
		_ = s.Client.Delete(context.Background(), ji)
		eventually(t, within, "the service's workers gone", func(context.Context) (bool, error) {
			_, err := bigModelServed()
			return err != nil && edgePods(t) == 0, nil
		})
	})
	eventually(t, within, "the service Ready", func(ctx context.Context) (bool, error) {
		got := &v1alpha1.JointInferenceService{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, jointinference.ConditionReady), nil
	})
	pod := littleModelPod(t)
	eventually(t, within, "the little model running", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	return ji, pod
}

// edgeWorkerStatus is the service's status record of its edge worker.
func edgeWorkerStatus(ctx context.Context, ji *v1alpha1.JointInferenceService) (v1alpha1.WorkerStatus, error) {
	got := &v1alpha1.JointInferenceService{}
	if err := s.Client.Get(ctx, client.ObjectKeyFromObject(ji), got); err != nil {
		return v1alpha1.WorkerStatus{}, err
	}
	for _, w := range got.Status.Workers {
		if w.Role == v1alpha1.WorkerRoleEdge {
			return w, nil
		}
	}
	return v1alpha1.WorkerStatus{}, nil
}

// waitEdgeWorker waits until the edge worker's record satisfies ok and says how long that took.
func waitEdgeWorker(t *testing.T, ji *v1alpha1.JointInferenceService, what string, ok func(v1alpha1.WorkerStatus) bool) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, within, what, func(ctx context.Context) (bool, error) {
		w, err := edgeWorkerStatus(ctx, ji)
		return err == nil && ok(w), err
	})
	return time.Since(start)
}

// edgePods counts the service's edge worker pods in the API, on every node.
func edgePods(t *testing.T) int {
	t.Helper()
	pods := &corev1.PodList{}
	if err := s.Client.List(context.Background(), pods, client.MatchingLabels{"lifeline.sedna.io/role": "edge",
		"jointinferenceservice.sedna.io/name": "helmet-detection-inference-example"}); err != nil {
		t.Fatal(err)
	}
	return len(pods.Items)
}

// hasEvent tells whether the service has an Event with that reason.
func hasEvent(ctx context.Context, ji *v1alpha1.JointInferenceService, reason string) bool {
	list := &eventsv1.EventList{}
	if err := s.Client.List(ctx, list, client.InNamespace(ji.Namespace)); err != nil {
		return false
	}
	for _, e := range list.Items {
		if e.Regarding.UID == ji.UID && e.Reason == reason {
			return true
		}
	}
	return false
}

// 1. Cut off from the API server only: the agent's word reaches the status, the controller asks the agent to
// restart the dead worker, and there is never a second pod.
func TestCutOffFromTheAPIServerTheAgentReportsAndRestarts(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	s.CutAPI(edgeNode)
	defer s.RestoreAPI(edgeNode)
	waitEdgeWorker(t, ji, "the status taken from the agent", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	if err := s.KillWorker(edgeNode, "default", pod.Name, "little-model"); err != nil {
		t.Fatal(err)
	}
	detected := waitEdgeWorker(t, ji, "the status showing the worker dead, from the agent", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessDead
	})
	rebuilt := waitEdgeWorker(t, ji, "the status showing the worker running again, from the agent", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive && w.Restarts >= 1
	})
	t.Logf("kill -> status Dead: %v; then -> Alive again: %v", detected.Round(time.Millisecond), rebuilt.Round(time.Millisecond))
	if !s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") {
		t.Error("the status says Alive but the little model's process does not run")
	}
	eventually(t, within, "the RestartCommandSent and RestartedByAgent events", func(ctx context.Context) (bool, error) {
		return hasEvent(ctx, ji, jointinference.ReasonRestartCommandSent) && hasEvent(ctx, ji, liveness.ReasonRestartedByAgent), nil
	})
	if n := edgePods(t); n != 1 {
		t.Errorf("%d edge worker pods, want exactly 1", n)
	}
	s.RestoreAPI(edgeNode)
	waitEdgeWorker(t, ji, "the API server the truth again", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == 1
	})
}

// 2. Cut off from the API server and the broker: the agent restarts the worker by its offline policy; after
// the links return, the API server's record shows exactly that one restart, and the cloud learns of it.
func TestCutOffFromEverythingTheAgentHealsByPolicy(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	s.CutAPI(edgeNode)
	s.CutBroker(edgeNode)
	defer s.RestoreAPI(edgeNode)
	defer s.RestoreBroker(edgeNode)
	time.Sleep(3 * time.Second) // past the agent's API grace (2 s in the simulation)
	if err := s.KillWorker(edgeNode, "default", pod.Name, "little-model"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, within, "the little model restarted on the node", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	t.Logf("kill -> running again, cut off from everything: %v", time.Since(killed).Round(time.Millisecond))
	s.RestoreBroker(edgeNode)
	s.RestoreAPI(edgeNode)
	waitEdgeWorker(t, ji, "the API server the truth again, with the one restart", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == 1
	})
	eventually(t, within, "the RestartedOffline event, from the journal's replay", func(ctx context.Context) (bool, error) {
		return hasEvent(ctx, ji, liveness.ReasonRestartedOffline), nil
	})
	if n := edgePods(t); n != 1 {
		t.Errorf("%d edge worker pods, want exactly 1", n)
	}
}
