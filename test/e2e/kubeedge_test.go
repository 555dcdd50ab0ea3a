package e2e

// What real KubeEdge does differently from what Lifeline first assumed, each as a test on the hollow node that
// now behaves as edgecore does (docs/simulation.md).

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/lifeline-edge/lifeline/edge/agent/core"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
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

// waitListed waits until the node's agent has listed pod among its workers, in the file it keeps them in.
func waitListed(t testing.TB, node string, pod *corev1.Pod) {
	t.Helper()
	eventually(t, within, node+"'s agent listing "+pod.Name+" among its workers", func(context.Context) (bool, error) {
		data, err := os.ReadFile(filepath.Join(s.AgentStateDir(node), "desired-workers.json"))
		if os.IsNotExist(err) {
			return false, nil
		}
		return err == nil && strings.Contains(string(data), `"uid":"`+string(pod.UID)+`"`), err
	})
}

// waitTrainer waits until the job's status record of the named trainer satisfies ok.
func waitTrainer(t testing.TB, job *v1alpha1.FederatedLearningJob, trainer, what string, ok func(v1alpha1.WorkerStatus) bool) {
	t.Helper()
	eventually(t, within, trainer+": "+what, func(ctx context.Context) (bool, error) {
		got := &v1alpha1.FederatedLearningJob{}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return false, err
		}
		for _, w := range got.Status.Workers {
			if w.Name == trainer {
				return ok(w), nil
			}
		}
		return false, nil
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

// readMetaServer has the node's agent read its workers from the node's MetaServer for the test, as with the
// chart's agent.edgecore.metaServer set, rather than from the controller's word.
func readMetaServer(t testing.TB, node string) {
	t.Helper()
	if err := s.ReadMetaServer(node, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.ReadMetaServer(node, false); err != nil {
			t.Error(err)
		}
	})
}

// (a) Cut off, edgecore's MetaServer ignores a fieldSelector (it lists nothing): an agent installed while its node
// is cut off, with an empty state directory, still learns the node's workers and reports a death.
func TestAgentStartedCutOffWithAnEmptyStateLearnsItsWorkers(t *testing.T) {
	skipShort(t)
	readMetaServer(t, edgeNode)
	ji, pod := readyService(t)
	cutOff(t, edgeNode, false)
	waitCutOffInTheMetaServer(t, edgeNode)
	if got := metaServerPods(t, edgeNode, url.Values{"labelSelector": {roleLabel}, "fieldSelector": {"spec.nodeName=" + edgeNode}}); len(got) != 0 {
		t.Fatalf("the cut-off MetaServer honoured a fieldSelector (%v); edgecore's lists nothing", got)
	}
	births := heard(t, lifelinev1.KindBirth)
	freshAgent(t, edgeNode)
	// The new agent knows the worker (its list) and its session is up (its birth heard) before the kill: a death it
	// learnt of, or told, later could be overtaken by the node's restart of the worker before the controller heard it.
	waitListed(t, edgeNode, pod)
	waitHeard(t, lifelinev1.KindBirth, births, "the new agent's birth heard by the controller")
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
	readMetaServer(t, edgeNode)
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
	births, states := heard(t, lifelinev1.KindBirth), heard(t, lifelinev1.KindWorkerState)
	restarted := time.Now()
	restartAgent(t, edgeNode)
	// A pod the agent took for its own would be published, as lost, by the first pass over its workers after it
	// listed them: wait until it listed (its file of workers written anew), its session began, the states of that
	// session reached the controller, and two heartbeat intervals more, in which its observations (every 500 ms)
	// publish whatever else it holds.
	eventually(t, within, edgeNode+"'s agent listing its workers anew", func(context.Context) (bool, error) {
		info, err := os.Stat(filepath.Join(s.AgentStateDir(edgeNode), "desired-workers.json"))
		return err == nil && info.ModTime().After(restarted), err
	})
	waitHeard(t, lifelinev1.KindBirth, births, "the restarted agent's birth heard by the controller")
	waitHeard(t, lifelinev1.KindWorkerState, states, "the restarted agent's worker states heard by the controller")
	waitAgentsBeat(t, heard(t, lifelinev1.KindHeartbeat), 2, "two more heartbeat intervals of the agents")
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
	waitTrainer(t, job, trainer, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent
	})
	throttled := func() float64 { return controllerCount(t, "lifeline_liveness_commands_throttled_total", "") }
	held := throttled()
	states := heard(t, lifelinev1.KindWorkerState)
	if err := s.KillWorker("edge1", "default", trainer, "train-worker"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // what each stop did to the exited container on the rig's runtime: a new state of the dead worker
		// Each a state of its own: the agent has published the one before.
		states = waitHeard(t, lifelinev1.KindWorkerState, states, fmt.Sprintf("state %d of the dead trainer heard by the controller", i+1))
		if err := s.RestampExit("edge1", "default", trainer); err != nil {
			t.Fatal(err)
		}
	}
	waitHeard(t, lifelinev1.KindWorkerState, states, "the last state of the dead trainer heard by the controller")
	eventually(t, within, "the trainer running again as a static pod", func(context.Context) (bool, error) {
		return s.StandInRunning("edge1", "default", trainer, "train-worker"), nil
	})
	eventually(t, within, "the command and the rebuild told in Events", func(context.Context) (bool, error) {
		return eventCount(t, job, edgeaware.ReasonRestartCommandSent) > 0 &&
			eventCount(t, job, edgeaware.ReasonRestartedByAgent)+eventCount(t, job, edgeaware.ReasonRestartedOffline) > 0, nil
	})
	// A second command would be decided in a reconcile that saw a state of the dead worker: one that began after
	// the last was heard has ended. Within 10 s of the first, a second is held back by the worker's rate limit
	// before it is sent, and counted then.
	waitReconciled(t, "federatedlearningjob", "the job reconciled after every state of the dead trainer")
	if n := throttled() - held; n != 0 {
		t.Errorf("%v commands held back by a rate limit: a second command was decided for one death", n)
	}
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
	beats := heard(t, lifelinev1.KindHeartbeat)
	waitEdgeWorker(t, ji, "the JI worker that exited 0 running again, by its node", func(w v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive && w.Restarts >= 1
	})
	// The agent acts alone once a worker has been dead for its wait for the controller, and the controller
	// within a heartbeat of hearing the state: two intervals past that wait, an action would have been taken.
	waitAgentsBeat(t, beats, int((core.DefaultHealTiming.ControllerWait+2*lifelinev1.DefaultHeartbeatInterval)/lifelinev1.DefaultHeartbeatInterval),
		"the agents past their wait for the controller since the workers exited")
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
	waitAgentsBeat(t, heard(t, lifelinev1.KindHeartbeat), 2, "a few heartbeats of the first session")
	replayed := func() float64 {
		v, err := s.ControllerMetric("lifeline_liveness_dropped_total", `reason="`+liveness.DropReplayed+`"`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := replayed()
	births := heard(t, lifelinev1.KindBirth)
	restartAgent(t, edgeNode)
	waitHeard(t, lifelinev1.KindBirth, births, "the restarted agent's birth heard by the controller")
	// Twice the silence the controller allows: had it dropped the new session's heartbeats, the node would be
	// silent by then.
	waitAgentsBeat(t, heard(t, lifelinev1.KindHeartbeat), 2*lifelinev1.SilentIntervals, "twice the silence the controller allows")
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
	eventually(t, within, "the trainer's stand-in armed: its gate waits on the node", func(context.Context) (bool, error) {
		return s.StandInArmed("edge1", "default", trainer, "train-worker"), nil
	})
	cut := time.Now()
	cutOff(t, "edge1", false)
	waitTrainer(t, job, trainer, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent
	})
	if err := s.KillWorker("edge1", "default", trainer, "train-worker"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if into := killed.Sub(cut); into >= edgehubNotice {
		t.Fatalf("the trainer failed %v into the cut, not before the node's edgehub noticed it (%v)", into, edgehubNotice)
	}
	// A third of the node's mirror-pod wait: a stand-in written at the rebuild cannot run this soon.
	eventually(t, mirrorPodTimeout/3, "the trainer running again as its armed stand-in", func(context.Context) (bool, error) {
		return s.StandInRunning("edge1", "default", trainer, "train-worker"), nil
	})
	t.Logf("failed %v into the cut -> running again as the armed stand-in after %v", killed.Sub(cut).Round(time.Millisecond),
		time.Since(killed).Round(time.Millisecond))
	s.RestoreAPI("edge1")
	eventually(t, 2*within, "the stand-in gone, a trainer of the job running in its own pod", func(ctx context.Context) (bool, error) {
		if s.StandInRunning("edge1", "default", trainer, "train-worker") {
			return false, nil
		}
		return trainerRunsOnEdge1(ctx, job, false)
	})
}

// [P-DES-1] [P-HEAL-3]: on a node as keadm leaves it, with no MetaServer for the agent to read, an agent started
// with an empty state learns its workers from the controller's word alone; the worker a cut-off node loses is
// rebuilt from it, and handed back once the link returns.
func TestLostPodIsRebuiltFromTheControllersWordWithoutAMetaServer_P_DES_1(t *testing.T) {
	skipShort(t)
	s.StopAgent(edgeNode)
	saved := filepath.Join(s.AgentStateDir(edgeNode), "desired-workers.json")
	if err := os.Remove(saved); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := s.StartAgent(edgeNode); err != nil {
		t.Fatal(err)
	}
	ji, pod := readyService(t)
	eventually(t, within, "the agent holding the controller's word on the worker", func(context.Context) (bool, error) {
		data, err := os.ReadFile(saved)
		return err == nil && strings.Contains(string(data), string(pod.UID)) && strings.Contains(string(data), `"manifest"`), nil
	})
	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool { return w.Source == v1alpha1.StatusSourceAgent })
	if err := s.LosePod(edgeNode, "default", pod.Name); err != nil {
		t.Fatal(err)
	}
	waitStandIn(t, pod)
	handBack(t, pod)
}
