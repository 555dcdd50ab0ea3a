package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

const edgeNode = "edge3" // where the example puts the JI edge worker

// readyService applies the helmet JI and waits until it is Ready and its little model runs.
func readyService(t testing.TB) (*v1alpha1.JointInferenceService, *corev1.Pod) {
	t.Helper()
	ji := apply(t, "joint-inference.yaml").(*v1alpha1.JointInferenceService)
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

// cutOff cuts the edge node's link to the API server, and to the broker too when fromBroker; the links are
// mended when the test ends, whatever happens.
func cutOff(t testing.TB, node string, fromBroker bool) {
	s.CutAPI(node)
	t.Cleanup(func() { s.RestoreAPI(node) })
	if fromBroker {
		s.CutBroker(node)
		t.Cleanup(func() { s.RestoreBroker(node) })
	}
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
func waitEdgeWorker(t testing.TB, ji *v1alpha1.JointInferenceService, what string, ok func(v1alpha1.WorkerStatus) bool) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, within, what, func(ctx context.Context) (bool, error) {
		w, err := edgeWorkerStatus(ctx, ji)
		return err == nil && ok(w), err
	})
	return time.Since(start)
}

// edgePods counts the service's edge worker pods in the API, on every node.
func edgePods(t testing.TB) int {
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
	return hasEventOn(ctx, ji, reason, "")
}

// hasEventOn is hasEvent for an Event related to node ("": any or none), as kubectl lifeline counts heals.
func hasEventOn(ctx context.Context, ji *v1alpha1.JointInferenceService, reason, node string) bool {
	list := &eventsv1.EventList{}
	if err := s.Client.List(ctx, list, client.InNamespace(ji.Namespace)); err != nil {
		return false
	}
	for _, e := range list.Items {
		if e.Regarding.UID == ji.UID && e.Reason == reason &&
			(node == "" || e.Related != nil && e.Related.Kind == "Node" && e.Related.Name == node) {
			return true
		}
	}
	return false
}

// 1. Cut off from the API server only: the agent's word reaches the status, dead then alive again; the node runs
// the crashed worker again after its crash back-off, with no command from the controller (a restart through the
// MetaServer only stops containers), and there is never a second pod.
func TestCutOffFromTheAPIServerTheAgentReportsAndTheNodeRestarts(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	waitAgentCondition(t, corev1.ConditionTrue, nodecondition.ReasonConnected)
	cut := time.Now()
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the status taken from the agent", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	waitAgentCondition(t, corev1.ConditionFalse, nodecondition.ReasonAPIServerUnreachable)
	t.Logf("cut -> the Node's LifelineAgent condition says so: %v", time.Since(cut).Round(time.Millisecond))
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
	if hasEvent(context.Background(), ji, edgeaware.ReasonRestartCommandSent) {
		t.Error("a command was sent for a worker its node restarts by itself")
	}
	if n := edgePods(t); n != 1 {
		t.Errorf("%d edge worker pods, want exactly 1", n)
	}
	s.RestoreAPI(edgeNode)
	waitEdgeWorker(t, ji, "the API server the truth again", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == 1
	})
	waitAgentCondition(t, corev1.ConditionTrue, nodecondition.ReasonConnected)
}

// waitAgentCondition waits until the edge node's LifelineAgent condition has status and reason.
func waitAgentCondition(t testing.TB, status corev1.ConditionStatus, reason string) {
	t.Helper()
	eventually(t, within, edgeNode+"'s LifelineAgent condition "+reason, func(ctx context.Context) (bool, error) {
		node := &corev1.Node{}
		if err := s.Client.Get(ctx, client.ObjectKey{Name: edgeNode}, node); err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == nodecondition.Type {
				return c.Status == status && c.Reason == reason, nil
			}
		}
		return false, nil
	})
}

// 2. Cut off from the API server and the broker, the node loses the worker's pod (as an eviction would): the
// agent rebuilds it as a static pod by its offline policy; after the links return, the static pod gives way to
// the worker's own pod, and the cloud learns of the rebuild from the journal.
func TestCutOffFromEverythingTheAgentHealsByPolicy(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	// The API server first, until the agent says so, then the broker: the node is cut off from everything, and
	// its agent knows it. The agent's grace (2 s in the simulation) runs from then, on its own clock: the loss
	// is rebuilt once it has passed.
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	s.CutBroker(edgeNode)
	t.Cleanup(func() { s.RestoreBroker(edgeNode) })
	if err := s.LosePod(edgeNode, "default", pod.Name); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	eventually(t, within, "the worker running again as a static pod", func(context.Context) (bool, error) {
		return s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	t.Logf("pod lost -> running again as a static pod, cut off from everything: %v", time.Since(lost).Round(time.Millisecond))
	s.RestoreBroker(edgeNode)
	s.RestoreAPI(edgeNode)
	eventually(t, within, "the worker back in its own pod, the static pod gone", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") && !s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	eventually(t, within, "the RestartedOffline event on the node, from the journal's replay", func(ctx context.Context) (bool, error) {
		return hasEventOn(ctx, ji, edgeaware.ReasonRestartedOffline, edgeNode), nil
	})
	if n := edgePods(t); n != 1 {
		t.Errorf("%d edge worker pods, want exactly 1", n)
	}
}

// 3. A node rebooted while cut off from everything brings its workers back from its own disk state (the
// hollow node's pods, the agent's desired workers).
func TestNodeRebootedWhileCutOffBringsItsWorkersBack(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, true)
	if err := s.RestartNode(edgeNode); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "the little model running again on the rebooted, cut-off node", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	s.RestoreBroker(edgeNode)
	s.RestoreAPI(edgeNode)
	waitEdgeWorker(t, ji, "the API server the truth again", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive
	})
	if n := edgePods(t); n != 1 {
		t.Errorf("%d edge worker pods, want exactly 1", n)
	}
}

// 4. A partition longer than the node-monitor grace period: the node goes NotReady and is tainted, its workers
// stay (they tolerate it) and the agent stays the truth. Once the link returns the Node turns Ready and the status
// merges the API server's word again, from the Node alone: like edged, the hollow node re-posts a pod's status
// only when it changes (real KubeEdge (f)). Everything converges, with no pod left Terminating and no worker
// running twice.
func TestLongPartitionHealsWithoutDuplicates(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, false)
	nodeReady := func(ctx context.Context) (bool, error) {
		node := &corev1.Node{}
		if err := s.Client.Get(ctx, client.ObjectKey{Name: edgeNode}, node); err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}
	eventually(t, 2*within, "the node NotReady in the API", func(ctx context.Context) (bool, error) {
		ready, err := nodeReady(ctx)
		return !ready, err
	})
	waitEdgeWorker(t, ji, "the agent still the truth, the worker alive", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	s.RestoreAPI(edgeNode)
	eventually(t, within, "the node Ready again", nodeReady)
	before := &corev1.Pod{}
	if err := s.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), before); err != nil {
		t.Fatal(err)
	}
	converged := waitEdgeWorker(t, ji, "the API server the truth again, the worker alive", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive
	})
	after := &corev1.Pod{}
	if err := s.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), after); err != nil {
		t.Fatal(err)
	}
	t.Logf("Node Ready -> status converged in %v (the pod's status re-posted meanwhile: %v)", converged.Round(time.Millisecond),
		after.ResourceVersion != before.ResourceVersion)
	pods := &corev1.PodList{}
	if err := s.Client.List(context.Background(), pods, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			t.Errorf("pod %s left Terminating", p.Name)
		}
		for _, n := range []string{"cloud", "edge1", "edge2", "edge3"} {
			if s.WorkerRunning(n, "default", p.Name, "little-model") {
				running++
			}
		}
	}
	if running != 1 || !s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") {
		t.Errorf("%d little-model processes across the nodes, want exactly the original one", running)
	}
}

// 6. A service deleted while its edge node is cut off: once the node is back, every worker process there is
// gone and no pod is left.
func TestServiceDeletedWhileCutOffStopsItsWorkersOnReconnect(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, true)
	if err := s.Client.Delete(context.Background(), ji); err != nil {
		t.Fatal(err)
	}
	// Once the cloud has deleted the worker's pod, a node that heard of it would stop the worker.
	eventually(t, within, "the edge worker's pod deleted in the API", func(ctx context.Context) (bool, error) {
		got := &corev1.Pod{}
		err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), got)
		return apierrors.IsNotFound(err) || err == nil && got.DeletionTimestamp != nil, client.IgnoreNotFound(err)
	})
	if !s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") {
		t.Fatal("the cut-off node stopped its worker before it could know of the deletion")
	}
	s.RestoreAPI(edgeNode)
	s.RestoreBroker(edgeNode)
	eventually(t, within, "the little model stopped and its pod gone", func(context.Context) (bool, error) {
		return !s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") && edgePods(t) == 0, nil
	})
}

// 7. Forged, replayed and garbage messages, and a client without credentials, are refused and counted, and
// change nothing: the status of a worker on a cut-off node still says what its own agent says.
func TestForgedReplayedAndGarbageMessagesChangeNothing(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	// Each message is refused under its own reason, and counted as it is: counted, it was not taken.
	reasons := []string{liveness.DropAuth, liveness.DropDenied, liveness.DropForged, liveness.DropDecode, liveness.DropReplayed}
	dropped := func() map[string]float64 {
		out := map[string]float64{}
		for _, r := range reasons {
			out[r] = controllerCount(t, "lifeline_liveness_dropped_total", `reason="`+r+`"`)
		}
		return out
	}
	start, births := dropped(), heard(t, lifelinev1.KindBirth)
	dead := &lifelinev1.WorkerState{Namespace: "default", Name: pod.Name, Uid: string(pod.UID), Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}
	deadPayload, _ := proto.Marshal(dead)
	edge3Topic := lifelinev1.WorkerTopic(harness.Cluster, edgeNode, "default", pod.Name).String()
	edge1Topic := lifelinev1.WorkerTopic(harness.Cluster, "edge1", "default", pod.Name).String()

	if _, err := mqttClient(t, "", ""); err == nil {
		t.Error("a client without credentials was admitted")
	}
	edge1Password, _ := s.MQTTPassword("edge1")
	rogue, err := mqttClient(t, "edge1", edge1Password)
	if err != nil {
		t.Fatal(err)
	}
	rogue.Publish(edge3Topic, 0, false, deadPayload).Wait()        // another node's topic: the ACL refuses it
	rogue.Publish(edge1Topic, 1, false, deadPayload).Wait()        // its own topic, about edge3's pod: forged
	rogue.Publish(edge1Topic, 1, false, []byte{0xde, 0xad}).Wait() // garbage
	// An old seq, as a replay would carry, under edge3's credentials. Taking its session over, the replayer ends
	// the agent's, which comes back at once and may take the session back before the replay is read: it is sent
	// again, by a new replayer, until it was read.
	edge3Password, _ := s.MQTTPassword(edgeNode)
	lastReplay := time.Time{}
	testkit.UntilErr(t, within, "every message refused under its reason", testkit.Why(func() (bool, string) {
		now := dropped()
		if now[liveness.DropReplayed] <= start[liveness.DropReplayed] && time.Since(lastReplay) > 2*time.Second {
			lastReplay = time.Now()
			if replayer, err := mqttClient(t, edgeNode, edge3Password); err == nil {
				replayer.Publish(edge3Topic, 1, false, deadPayload).Wait()
			}
		}
		for _, r := range reasons {
			if now[r] <= start[r] {
				return false, fmt.Sprintf("none dropped as %s yet (dropped now: %v, at the start: %v)", r, now, start)
			}
		}
		return true, ""
	}))
	// A node's credentials come with its agent's client id: the rogue and the replayer took edge1's and edge3's
	// agents' sessions over, and the agents were gone until they took them back. The status is read once both
	// are back and the service was reconciled since.
	waitCount(t, "lifeline_liveness_messages_total", `kind="`+lifelinev1.KindBirth.String()+`"`, births+2,
		"the births of edge1's and edge3's agents, back from the takeovers")
	waitReconciled(t, "jointinferenceservice", "the service reconciled since the agents came back")
	w, err := edgeWorkerStatus(context.Background(), ji)
	if err != nil {
		t.Fatal(err)
	}
	if w.Liveness != v1alpha1.LivenessAlive || w.Source != v1alpha1.StatusSourceAgent || w.Restarts != 0 {
		t.Errorf("the edge worker's status changed: %+v", w)
	}
	if hasEvent(context.Background(), ji, edgeaware.ReasonRestartCommandSent) {
		t.Error("a restart command was sent on forged input")
	}
}

func mqttClient(t *testing.T, user, password string) (mqtt.Client, error) {
	t.Helper()
	// The broker admits a node's credentials only under that node's agent's client id (taking its session over).
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("ssl://" + s.MQTTAddress()).SetClientID(lifelinev1.AgentClientID(user)).
		SetTLSConfig(s.BrokerTLS()).SetUsername(user).SetPassword(password).SetProtocolVersion(4).SetAutoReconnect(false))
	tok := c.Connect()
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		return nil, tok.Error()
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c, nil
}

// 5. A federated learning job whose trainer node is cut off mid-training: the trainer killed there is restarted
// by its node (restartPolicy OnFailure), its status in the agent's word; the job waits for it and completes.
func TestFederatedLearningCompletesWithATrainerCutOff(t *testing.T) {
	skipShort(t)
	job := apply(t, "federated-learning.yaml",
		func(o client.Object) {
			o.SetName("surface-defect-detection-cut-off")
			o.(*v1alpha1.FederatedLearningJob).Spec.AggregationWorker.Template.Spec.Containers[0].Env =
				[]corev1.EnvVar{{Name: "exit_round", Value: "25"}}
		}).(*v1alpha1.FederatedLearningJob)
	trainer := fl.TrainerName(job.GetName(), 0) // on edge1
	eventually(t, within, "trainer 0 running", func(context.Context) (bool, error) {
		return s.WorkerRunning("edge1", "default", trainer, "train-worker"), nil
	})
	trainerStatus := func(ctx context.Context) (v1alpha1.WorkerStatus, *v1alpha1.FederatedLearningJob, error) {
		got := &v1alpha1.FederatedLearningJob{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return v1alpha1.WorkerStatus{}, nil, err
		}
		for _, w := range got.Status.Workers {
			if w.Name == trainer {
				return w, got, nil
			}
		}
		return v1alpha1.WorkerStatus{}, got, nil
	}
	cutOff(t, "edge1", false)
	eventually(t, within, "trainer 0's status from the agent", func(ctx context.Context) (bool, error) {
		w, _, err := trainerStatus(ctx)
		return w.Source == v1alpha1.StatusSourceAgent, err
	})
	if err := s.KillWorker("edge1", "default", trainer, "train-worker"); err != nil {
		t.Fatal(err)
	}
	// Restarted by its node after the back-off; it may finish its last rounds before a status shows it running.
	eventually(t, within, "trainer 0 restarted while cut off", func(ctx context.Context) (bool, error) {
		w, _, err := trainerStatus(ctx)
		return w.Source == v1alpha1.StatusSourceAgent && w.Restarts >= 1 && (w.Liveness == v1alpha1.LivenessAlive || w.Phase == "Succeeded"), err
	})
	eventually(t, 2*within, "the job Succeeded, its trainer node still cut off", func(ctx context.Context) (bool, error) {
		_, got, err := trainerStatus(ctx)
		if err != nil {
			return false, err
		}
		if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.FLConditionFailed) {
			return false, fmt.Errorf("job failed: %+v", got.Status.Conditions)
		}
		return got.Status.Phase == v1alpha1.FLJobSucceeded, nil
	})
	s.RestoreAPI("edge1")
	eventually(t, within, "no pod of the job left Terminating", func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := s.Client.List(ctx, pods, client.InNamespace("default")); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil && strings.HasPrefix(p.Name, job.GetName()) {
				return false, nil
			}
		}
		return true, nil
	})
}

// 8. A node cut off from the API server loses a worker's pod (as an eviction would): the controller asks the
// agent to rebuild it, the agent runs it as a static pod from its last known manifest, and once the link is
// back the static pod gives way to the worker's own pod: one worker process in the end, under its own name.
func TestLostPodIsRebuiltAsAStaticPodAndHandedBack(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool { return w.Source == v1alpha1.StatusSourceAgent })
	if err := s.LosePod(edgeNode, "default", pod.Name); err != nil {
		t.Fatal(err)
	}
	waitStandIn(t, pod)
	eventually(t, within, "the rebuild told in Events", func(ctx context.Context) (bool, error) {
		return hasEvent(ctx, ji, edgeaware.ReasonRestartCommandSent) && hasEvent(ctx, ji, edgeaware.ReasonRestartedByAgent), nil
	})
	handBack(t, pod)
	waitEdgeWorker(t, ji, "the API server the truth again", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive
	})
	if n := edgePods(t); n != 1 {
		t.Errorf("%d edge worker pods in the API, want exactly 1", n)
	}
}

// waitStandIn waits until the edge worker runs again as its static pod (edged names a static pod after its node).
func waitStandIn(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	eventually(t, within, "the worker running again as a static pod", func(context.Context) (bool, error) {
		return s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
}

// handBack gives the edge node its link to the API server back and waits until the worker runs in its own pod
// again, its static pod gone.
func handBack(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	s.RestoreAPI(edgeNode)
	eventually(t, within, "the worker back in its own pod, the static pod gone", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") && !s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
}

// 9. The agent is down when a cut-off node loses a worker's pod, and starts again with the node still cut
// off: it has published nothing of the worker in its new life, but the node's store says the node ran it, so
// it reports the worker lost (not alive, as the last session said) and rebuilds it.
func TestAgentRestartedAfterALossRebuildsTheWorker(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool { return w.Source == v1alpha1.StatusSourceAgent })
	s.StopAgent(edgeNode)
	if err := s.LosePod(edgeNode, "default", pod.Name); err != nil {
		t.Fatal(err)
	}
	if err := s.StartAgent(edgeNode); err != nil {
		t.Fatal(err)
	}
	waitStandIn(t, pod)
	handBack(t, pod)
}

// 10. A process on the node posts the largest reports as fast as it can for one of the node's workers while the
// node is cut off from the broker and the API server, and the worker dies meanwhile. The agent, under the chart's
// 64 MiB limit, is never killed; reports beyond the worker's rate are refused; once the broker is back the
// worker's death reaches the status from the agent.
func TestReportFloodWhileTheBrokerIsAwayStaysWithinTheAgentsLimit(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, true)
	body, err := json.Marshal(map[string]any{"name": pod.Name, "namespace": "default", "ownerName": ji.Name,
		"ownerKind": "jointinferenceservice", "kind": "inference", "ownerInfo": map[string]any{"pad": strings.Repeat("x", 60<<10)}})
	if err != nil {
		t.Fatal(err)
	}
	url := s.ReportURL(edgeNode) + "/sedna/workers/" + pod.Name + "/info"
	var mu sync.Mutex
	answers := map[int]int{}
	var wg sync.WaitGroup
	end := time.Now().Add(8 * time.Second)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 5 * time.Second}
			for time.Now().Before(end) {
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				code := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				answers[code]++
				mu.Unlock()
			}
		}()
	}
	t.Cleanup(wg.Wait) // the flood ends before the links are mended, whatever happens
	// The worker dies while the flood is under way: its rate taken and the rest refused.
	testkit.Until(t, time.Until(end), "the flood under way: reports taken and refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return answers[http.StatusOK] > 0 && answers[http.StatusTooManyRequests] > 0
	})
	if err := s.KillWorker(edgeNode, "default", pod.Name, "little-model"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("answers to the flood by status: %v", answers)
	if answers[http.StatusTooManyRequests] == 0 || answers[http.StatusOK] == 0 {
		t.Errorf("answers %v: want the worker's rate taken and the rest refused with 429", answers)
	}
	s.RestoreBroker(edgeNode)
	waitEdgeWorker(t, ji, "the worker's death in the status, from the agent", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && (w.Liveness == v1alpha1.LivenessDead || w.Restarts >= 1)
	})
	use, err := s.MemoryUse()
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := use["agent-"+edgeNode]; ok {
		t.Logf("agent's peak memory %.1f MiB", float64(u.PeakBytes)/(1<<20))
		if u.OOMKills > 0 {
			t.Errorf("the agent was killed %d times for outgrowing its 64 MiB", u.OOMKills)
		}
	} else {
		t.Log("no memory cgroup on this machine: the agent ran without its limit")
	}
	if err := s.AgentExited(edgeNode); err != nil {
		t.Errorf("the agent ended during the flood: %v", err)
	}
}
