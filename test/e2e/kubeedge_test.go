package e2e

// What real KubeEdge does differently from what Lifeline first assumed, each as a test on the hollow node that
// now behaves as edgecore does (docs/simulation.md).

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

const roleLabel = "lifeline.sedna.io/role"

// metaServerPods lists pods through an edge node's MetaServer and returns "<node>/<name>" of each.
func metaServerPods(t testing.TB, node string, query url.Values) []string {
	t.Helper()
	resp, err := http.Get(s.MetaServerURL(node) + "/api/v1/pods?" + query.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	list := &corev1.PodList{}
	if err := json.NewDecoder(resp.Body).Decode(list); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		out = append(out, p.Spec.NodeName+"/"+p.Name)
	}
	return out
}

// onlyOn tells whether every "<node>/<name>" is on node.
func onlyOn(pods []string, node string) bool {
	for _, p := range pods {
		if !strings.HasPrefix(p, node+"/") {
			return false
		}
	}
	return true
}

// eventCount counts the occurrences of Events with reason about obj (a series counts as its count).
func eventCount(t testing.TB, obj client.Object, reason string) int {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := s.Client.List(context.Background(), list, client.InNamespace(obj.GetNamespace())); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.UID != obj.GetUID() || e.Reason != reason {
			continue
		}
		if e.Series != nil {
			n += int(e.Series.Count)
		} else {
			n++
		}
	}
	return n
}

// waitCutOffInTheMetaServer waits until the node's MetaServer answers from the node's own store: the service's
// cloud worker, another node's pod the cloud lists, is gone from its answer.
func waitCutOffInTheMetaServer(t testing.TB, node string) {
	t.Helper()
	// The node's store selects nothing by a field: the node's own workers, listed by their node, vanish. (By label
	// alone it may list other nodes' pods too: those a forwarded list or watch delivered while connected.)
	eventually(t, within, node+"'s MetaServer answering from the node's store", func(context.Context) (bool, error) {
		byLabel := metaServerPods(t, node, url.Values{"labelSelector": {roleLabel}})
		byNode := metaServerPods(t, node, url.Values{"labelSelector": {roleLabel}, "fieldSelector": {"spec.nodeName=" + node}})
		return len(byLabel) > 0 && len(byNode) == 0, nil
	})
}

// restartAgent stops the node's agent and starts it again, its state kept.
func restartAgent(t testing.TB, node string) {
	t.Helper()
	s.StopAgent(node)
	if err := s.StartAgent(node); err != nil {
		t.Fatal(err)
	}
}

// freshAgent starts the node's agent again with an empty state directory, as on a node where it was just
// installed; when the test ends the agent runs again with the state it had, so later tests meet the node as
// they expect.
func freshAgent(t testing.TB, node string) {
	t.Helper()
	dir := s.AgentStateDir(node)
	s.StopAgent(node)
	if err := os.Rename(dir, dir+".kept"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.StopAgent(node)
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
		if err := os.Rename(dir+".kept", dir); err != nil {
			t.Error(err)
		}
		if err := s.StartAgent(node); err != nil {
			t.Error(err)
		}
	})
	if err := s.StartAgent(node); err != nil {
		t.Fatal(err)
	}
}

// (a) Cut off, edgecore's MetaServer ignores a fieldSelector (it lists nothing): an agent installed while its node
// is cut off, with an empty state directory, still learns the node's workers and reports a death.
func TestAgentStartedCutOffWithAnEmptyStateLearnsItsWorkers(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, false)
	waitCutOffInTheMetaServer(t, edgeNode)
	if got := metaServerPods(t, edgeNode, url.Values{"labelSelector": {roleLabel}, "fieldSelector": {"spec.nodeName=" + edgeNode}}); len(got) != 0 {
		t.Fatalf("the cut-off MetaServer honoured a fieldSelector (%v); edgecore's lists nothing", got)
	}
	freshAgent(t, edgeNode)
	time.Sleep(3 * time.Second) // the new agent connected and listed its workers
	if err := s.KillWorker(edgeNode, "default", pod.Name, "little-model"); err != nil {
		t.Fatal(err)
	}
	waitEdgeWorker(t, ji, "the worker's death reported by the agent that started cut off", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessDead
	})
}

// (b) Connected, edgecore's MetaServer is not scoped to its node: it lists every node's pods. The agent still
// publishes only its own node's workers (the controller would drop the others as forged).
func TestAgentNeverPublishesOtherNodesPodsTheMetaServerLists(t *testing.T) {
	skipShort(t)
	readyService(t)
	pods := metaServerPods(t, edgeNode, url.Values{"labelSelector": {roleLabel}})
	if onlyOn(pods, edgeNode) {
		t.Fatalf("the connected MetaServer listed only %s's pods (%v); edgecore's lists every node's", edgeNode, pods)
	}
	if got := metaServerPods(t, edgeNode, url.Values{"labelSelector": {roleLabel}, "fieldSelector": {"spec.nodeName=" + edgeNode}}); len(got) != 1 || !onlyOn(got, edgeNode) {
		t.Errorf("through the cloud, fieldSelector=spec.nodeName=%s listed %v, want the node's one worker", edgeNode, got)
	}
	forged := func() float64 {
		v, err := s.ControllerMetric("lifeline_liveness_dropped_total", `reason="`+liveness.DropForged+`"`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := forged()
	restartAgent(t, edgeNode)
	time.Sleep(5 * time.Second) // listed, watched and published
	if after := forged(); after != before {
		t.Errorf("%v states dropped as forged after %s's agent started: it published other nodes' pods", after-before, edgeNode)
	}
	data, err := os.ReadFile(filepath.Join(s.AgentStateDir(edgeNode), "desired-workers.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if node, name, _ := strings.Cut(p, "/"); node != edgeNode && strings.Contains(string(data), `"`+name+`"`) {
			t.Errorf("%s's agent took %s, a pod of %s, for one of its workers", edgeNode, name, node)
		}
	}
}

// (c) One death on a cut-off node is one episode: exactly one command, and one result, however many states the
// dead worker goes through (here its exit re-stamped three times, as the stops of a runtime that re-stamps exited
// containers did on the rig). The worker is an FL trainer under restartPolicy Never, which the node never runs
// again: the controller has it rebuilt as a static pod while the cloud cannot replace it.
func TestOneDeathOnACutOffNodeGetsOneCommand(t *testing.T) {
	skipShort(t)
	job, trainer := neverTrainerJob(t, "surface-defect-detection-one-death")
	cutOff(t, "edge1", false)
	time.Sleep(3 * time.Second) // the agent the truth
	if err := s.KillWorker("edge1", "default", trainer, "train-worker"); err != nil {
		t.Fatal(err)
	}
	for range 3 { // what each stop did to the exited container on the rig's runtime: a new state of the dead worker
		time.Sleep(500 * time.Millisecond)
		if err := s.RestampExit("edge1", "default", trainer); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, within, "the trainer running again as a static pod", func(context.Context) (bool, error) {
		return s.WorkerRunning("edge1", "default", trainer+"-edge1", "train-worker"), nil
	})
	time.Sleep(3 * time.Second) // a late second command would have been sent by now
	if n := eventCount(t, job, edgeaware.ReasonRestartCommandSent); n != 1 {
		t.Errorf("%d commands for one death, want 1", n)
	}
	if n := eventCount(t, job, edgeaware.ReasonRestartedByAgent) + eventCount(t, job, edgeaware.ReasonRestartedOffline); n != 1 {
		t.Errorf("%d rebuilds by the agent for one death, want 1", n)
	}
}

// (d) On a cut-off node, a JI worker (restartPolicy Always) that exits 0 is down, and its node runs it again by
// itself: Lifeline asks nothing of the agent (a restart would only stop it). An FL trainer (OnFailure) that exits
// 0 has completed: nothing restarts it.
func TestExitZeroOnACutOffNodeTheNodeRestartsAJIWorkerAndAnFLTrainerCompletes(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	job := apply(t, "federated-learning.yaml",
		func(o client.Object) {
			o.SetName("surface-defect-detection-exit-zero")
			o.(*v1alpha1.FederatedLearningJob).Spec.AggregationWorker.Template.Spec.Containers[0].Env =
				[]corev1.EnvVar{{Name: "exit_round", Value: "100000"}}
		}).(*v1alpha1.FederatedLearningJob)
	trainer := fl.TrainerName(job.GetName(), 0) // on edge1
	eventually(t, within, "trainer 0 running", func(context.Context) (bool, error) {
		return s.WorkerRunning("edge1", "default", trainer, "train-worker"), nil
	})
	cutOff(t, edgeNode, false)
	cutOff(t, "edge1", false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	if err := s.EndWorker(edgeNode, "default", pod.Name, "little-model"); err != nil {
		t.Fatal(err)
	}
	if err := s.EndWorker("edge1", "default", trainer, "train-worker"); err != nil {
		t.Fatal(err)
	}
	waitEdgeWorker(t, ji, "the JI worker that exited 0 running again, by its node", func(w v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive && w.Restarts >= 1
	})
	time.Sleep(5 * time.Second) // past the agent's wait for the controller: an action would have been taken
	for _, o := range []client.Object{ji, job} {
		for _, reason := range []string{edgeaware.ReasonRestartCommandSent, edgeaware.ReasonRestartedByAgent, edgeaware.ReasonRestartedOffline} {
			if n := eventCount(t, o, reason); n != 0 {
				t.Errorf("%d %s Events for %s, which its node restarts or which completed", n, reason, o.GetName())
			}
		}
	}
	if s.WorkerRunning("edge1", "default", trainer, "train-worker") {
		t.Error("the trainer that exited 0 runs again")
	}
}

// (e) An agent restart begins its heartbeat sequence again at 1: the controller takes the new birth as a reset,
// drops none of the new heartbeats as replayed, and the cut-off node stays online (its agent the truth).
func TestAgentRestartKeepsItsHeartbeatsCounting(t *testing.T) {
	skipShort(t)
	ji, _ := readyService(t)
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	time.Sleep(2 * time.Second) // a few heartbeats of the first session
	replayed := func() float64 {
		v, err := s.ControllerMetric("lifeline_liveness_dropped_total", `reason="`+liveness.DropReplayed+`"`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := replayed()
	restartAgent(t, edgeNode)
	time.Sleep(6 * time.Second) // twice the silence the controller allows (three 1 s heartbeat intervals)
	if after := replayed(); after != before {
		t.Errorf("%v messages dropped as replayed after the agent restarted", after-before)
	}
	w, err := edgeWorkerStatus(context.Background(), ji)
	if err != nil {
		t.Fatal(err)
	}
	if w.Source != v1alpha1.StatusSourceAgent || w.Liveness != v1alpha1.LivenessAlive {
		t.Errorf("after the agent restart the edge worker is %s from %s, want Alive from the agent", w.Liveness, w.Source)
	}
}

// (e) [P-HEAL-3] A trainer under restartPolicy Never fails in the first second of a cut, before the node's
// edgehub noticed it: edged then holds a new static pod's mirror-pod request for 60 s (the hollow node imitates
// it), so a stand-in written at the rebuild would run only after a minute. Armed ahead, while the node reached
// the API server, the trainer's stand-in needs nothing from the cloud: the rebuild opens its gate and it runs
// within seconds; once the link returns it gives way to the job's own trainer.
func TestArmedStandInRunsATrainerFailedInTheFirstSecondOfACut_P_HEAL_3(t *testing.T) {
	skipShort(t)
	if err := s.ArmStandIns("edge1", true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.ArmStandIns("edge1", false) })
	if err := s.ImitateEdgehub("edge1", edgehubNotice, mirrorPodTimeout); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.ImitateEdgehub("edge1", 0, 0) })
	job, trainer := neverTrainerJob(t, "surface-defect-detection-armed")
	defer deleteAndWait(t, job)
	standIn := trainer + "-edge1"
	eventually(t, within, "the trainer's stand-in armed: its gate waits on the node", func(context.Context) (bool, error) {
		return s.WorkerRunning("edge1", "default", standIn, "lifeline-gate"), nil
	})
	cutOff(t, "edge1", false)
	time.Sleep(time.Second)
	if err := s.KillWorker("edge1", "default", trainer, "train-worker"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// A third of the node's mirror-pod wait: a stand-in written at the rebuild cannot run this soon.
	eventually(t, mirrorPodTimeout/3, "the trainer running again as its armed stand-in", func(context.Context) (bool, error) {
		return s.WorkerRunning("edge1", "default", standIn, "train-worker"), nil
	})
	t.Logf("failed 1 s into the cut -> running again as the armed stand-in after %v", time.Since(killed).Round(time.Millisecond))
	s.RestoreAPI("edge1")
	eventually(t, 2*within, "the stand-in gone, a trainer of the job running in its own pod", func(ctx context.Context) (bool, error) {
		if s.WorkerRunning("edge1", "default", standIn, "train-worker") {
			return false, nil
		}
		return trainerRunsOnEdge1(ctx, job, false)
	})
}
