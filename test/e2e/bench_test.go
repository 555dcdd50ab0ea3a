package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// Samples per measurement. Each kill is of a fresh pod, so that it meets the first step of edged's crash back-off
// (10 s here, as the kubelet's): the back-off doubles with every crash of one container and begins again only
// after it ran ten minutes, so repeated kills of one pod would measure the back-off's growth, not a restart.
const (
	killSamples = 3
	// flWait bounds the wait for a replacement of a failed trainer that restartPolicy Never leaves dead.
	flWait = 40 * time.Second
)

// BenchmarkCutOffNode measures, on the hollow node that behaves as edgecore, what Lifeline gives a node cut off
// from the API server, beside what Kubernetes and KubeEdge give alone, in the same run:
//   - kill -> the cloud's status shows the worker dead (agent's word), anchor: a connected node, the API
//     server's word;
//   - kill -> the worker runs again, anchor: the node's own crash back-off on a connected node. They are about
//     equal: edged restarts a crashed container only after its back-off, also when asked through the
//     MetaServer, so Lifeline cannot hasten it under restartPolicy Always;
//   - a lost pod -> the worker runs again as a static pod, anchor: never, while the node is cut off;
//   - an FL trainer with restartPolicy Never that fails on a cut-off node: replaced or not (anchor: never); and
//     the same at three moments of a cut, the node imitating edgehub's late notice and its mirror-pod wait;
//   - once the link is back, the time the status takes to converge, and workers found running twice; and, the node
//     imitating edgehub's reconnect cycle, how long the status shows the API server's pod as posted before the cut.
func BenchmarkCutOffNode(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the simulation")
	}
	for range b.N {
		ji, _ := readyService(b)

		var apiDetection, backoff []time.Duration
		for i := range killSamples {
			pod := freshEdgePod(b, ji, i > 0)
			killed := killLittleModel(b, pod)
			harness.Eventually(b, within, "the API server showing the container stopped", func(ctx context.Context) (bool, error) {
				got := &corev1.Pod{}
				if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
					return false, err
				}
				cs := got.Status.ContainerStatuses
				return len(cs) == 1 && cs[0].State.Running == nil, nil
			})
			apiDetection = append(apiDetection, time.Since(killed))
			waitRunning(b, pod)
			backoff = append(backoff, time.Since(killed))
		}

		var detection, rebuild, told []time.Duration
		var convergence time.Duration
		for range killSamples {
			pod := freshEdgePod(b, ji, true)
			s.CutAPI(edgeNode)
			cutAt := time.Now()
			waitEdgeWorker(b, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
				return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
			})
			told = append(told, time.Since(cutAt))
			killed := killLittleModel(b, pod)
			var detected, running time.Duration
			b.Cleanup(func() { s.RestoreAPI(edgeNode) }) // the link mended, should the wait fail
			testkit.Every(b, 10*time.Millisecond, within, "the kill on the cut-off node shown dead and the worker running again",
				func(ctx context.Context) (bool, error) {
					if w, err := edgeWorkerStatus(ctx, ji); detected == 0 && err == nil &&
						w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessDead {
						detected = time.Since(killed)
					}
					if running == 0 && s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") {
						running = time.Since(killed)
					}
					return detected != 0 && running != 0, nil
				})
			detection, rebuild = append(detection, detected), append(rebuild, running)
			restored := time.Now()
			s.RestoreAPI(edgeNode)
			waitEdgeWorker(b, ji, "the API server's status with the restart", func(w v1alpha1.WorkerStatus) bool {
				return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == 1
			})
			convergence = max(convergence, time.Since(restored))
		}
		duplicates := duplicateWorkers(b)
		cycleConverged, stale := staleAfterReconnect(b, ji, reconnectCycle)

		pod := freshEdgePod(b, ji, true)
		s.CutAPI(edgeNode)
		waitEdgeWorker(b, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool { return w.Source == v1alpha1.StatusSourceAgent })
		lost := time.Now()
		if err := s.LosePod(edgeNode, "default", pod.Name); err != nil {
			b.Fatal(err)
		}
		harness.Eventually(b, within, "the lost worker running as a static pod", func(context.Context) (bool, error) {
			return s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
		})
		rebuiltLost := time.Since(lost)
		s.RestoreAPI(edgeNode)
		harness.Eventually(b, within, "the worker back in its own pod", func(context.Context) (bool, error) {
			return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model"), nil
		})

		replacedAfter, replaced := failNeverTrainerCutOff(b, "surface-defect-detection-never", 3*time.Second, flWait, false)
		byPhase, byPhaseArmed := rebuildByPhaseOfTheCut(b, false), rebuildByPhaseOfTheCut(b, true)

		b.Run("cut-told", func(b *testing.B) {
			// No anchor: without Lifeline the status keeps the API server's last word for the whole cut.
			b.ReportMetric(harness.Percentile(told, 50).Seconds(), "lifeline-p50-s")
			b.ReportMetric(harness.Percentile(told, 99).Seconds(), "lifeline-p99-s")
		})
		b.Run("detection", func(b *testing.B) {
			harness.ReportComparison(b, "Kill -> status shows the worker dead", "node cut off, agent's word", detection,
				"connected node, API server's word", apiDetection)
		})
		b.Run("rebuild", func(b *testing.B) {
			harness.ReportComparison(b, "Kill -> worker runs again (restartPolicy Always)", "node cut off (left to the node)", rebuild,
				"the node's own crash back-off", backoff)
		})
		b.Run("lost-pod", func(b *testing.B) {
			b.ReportMetric(float64(rebuiltLost.Milliseconds()), "lifeline-ms")
			b.ReportMetric(0, "anchor-replaced")
			fmt.Printf("\nLost pod on a cut-off node -> worker runs again as a static pod: %v (anchor: never, while cut off)\n",
				rebuiltLost.Round(time.Millisecond))
		})
		b.Run("fl-never-trainer", func(b *testing.B) {
			b.ReportMetric(boolMetric(replaced), "lifeline-replaced")
			b.ReportMetric(replacedAfter.Seconds(), "lifeline-replaced-s")
			b.ReportMetric(0, "anchor-replaced")
			if replaced {
				fmt.Printf("\nFL trainer (restartPolicy Never) failed on a cut-off node -> a trainer runs again after %v (anchor: never)\n",
					replacedAfter.Round(time.Millisecond))
			} else {
				fmt.Printf("\nFL trainer (restartPolicy Never) failed on a cut-off node -> nothing replaced it within %v (anchor: never)\n", flWait)
			}
		})
		b.Run("fl-never-trainer-by-phase", func(b *testing.B) {
			fmt.Printf("\nFL trainer (restartPolicy Never) failed on a node cut off from the API server, edgehub noticing the cut %v "+
				"after it began and holding a mirror-pod request %v meanwhile -> a trainer runs again:\n", edgehubNotice, mirrorPodTimeout)
			for i, p := range byPhaseArmed {
				anchor := byPhase[i]
				fmt.Printf("  failed %v into the cut: armed stand-in %s (anchor, a stand-in written at the rebuild: %s)\n",
					p.into, p.String(), anchor.String())
				if p.replaced {
					b.ReportMetric(p.after.Seconds(), fmt.Sprintf("armed-%ds-into-the-cut-s", int(p.into.Seconds())))
				}
				if anchor.replaced {
					b.ReportMetric(anchor.after.Seconds(), fmt.Sprintf("anchor-%ds-into-the-cut-s", int(anchor.into.Seconds())))
				}
			}
		})
		b.Run("reconnect", func(b *testing.B) {
			b.ReportMetric(convergence.Seconds(), "convergence-s")
			b.ReportMetric(float64(duplicates), "duplicates")
			b.ReportMetric(cycleConverged.Seconds(), "edgehub-cycle-convergence-s")
			b.ReportMetric(stale.Seconds(), "stale-status-s")
			fmt.Printf("\nReconnect after a kill while cut off: status converged within %v (worst of %d); duplicate workers: %d\n",
				convergence.Round(time.Millisecond), killSamples, duplicates)
			fmt.Printf("The node reconnecting on edgehub's %v cycle: converged within %v; the status showed the API server's "+
				"pod as posted before the cut for %v (anchor: the whole wait for the node's first post)\n",
				reconnectCycle, cycleConverged.Round(time.Millisecond), stale.Round(time.Millisecond))
		})
	}
}

func boolMetric(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// freshEdgePod returns the service's edge worker pod, running and shown alive by the API server; when replace,
// it first deletes the current pod, so the one returned is new (and so is its crash back-off).
func freshEdgePod(b testing.TB, ji *v1alpha1.JointInferenceService, replace bool) *corev1.Pod {
	b.Helper()
	old := littleModelPod(b)
	if replace {
		if err := s.Client.Delete(context.Background(), old); err != nil {
			b.Fatal(err)
		}
	}
	var pod *corev1.Pod
	harness.Eventually(b, within, "the edge worker running, in the API server's word", func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := s.Client.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{roleLabel: "edge",
			"jointinferenceservice.sedna.io/name": ji.Name}); err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && (!replace || p.UID != old.UID) {
				pod = p
			}
		}
		if pod == nil || len(pods.Items) != 1 || !s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") {
			return false, nil
		}
		w, err := edgeWorkerStatus(ctx, ji)
		return err == nil && w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Name == pod.Name, err
	})
	return pod
}

// The edgehub the phase scenario imitates: it notices a cut 5 s after it began (1.4 to 9.8 s on the KubeEdge
// rig) and holds a static pod's mirror-pod request for beehive's timeout meanwhile.
const (
	edgehubNotice    = 5 * time.Second
	mirrorPodTimeout = time.Minute
	phaseWait        = mirrorPodTimeout + 20*time.Second
)

// phaseRebuild is how soon a failed trainer ran again, by how far into the cut it failed.
type phaseRebuild struct {
	into, after time.Duration
	replaced    bool
}

// reconnectCycle is the edgehub retry cycle the hollow node imitates for staleAfterReconnect: shorter than the
// rig's 55 s, as long as the wait it makes is plain.
const reconnectCycle = 15 * time.Second

// staleAfterReconnect cuts the JI edge worker's node from the API server, the node imitating edgehub's reconnect
// cycle, kills the worker (the node restarts it, the agent tells it), restores the link, and waits until the status
// shows the API server's word with the restart. It returns that wait and, within it, how long the status showed the
// API server's pod as the node posted it before the cut (no restart): the stale word the agent's must hold off
// until the node posts again, at its next attempt to reconnect.
func staleAfterReconnect(b testing.TB, ji *v1alpha1.JointInferenceService, cycle time.Duration) (converged, stale time.Duration) {
	b.Helper()
	if err := s.ImitateEdgehubReconnect(edgeNode, cycle); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.ImitateEdgehubReconnect(edgeNode, 0) }()
	pod := freshEdgePod(b, ji, true)
	s.CutAPI(edgeNode)
	waitEdgeWorker(b, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	})
	killLittleModel(b, pod)
	waitEdgeWorker(b, ji, "the restart, in the agent's word", func(w v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == 1
	})
	restored := time.Now()
	s.RestoreAPI(edgeNode)
	last := restored
	testkit.Every(b, 10*time.Millisecond, cycle+within, "the API server's word with the restart, after the link's return",
		func(ctx context.Context) (bool, error) {
			w, err := edgeWorkerStatus(ctx, ji)
			now := time.Now()
			if err == nil && w.Source == v1alpha1.StatusSourceAPIServer && w.Restarts == 0 {
				stale += now.Sub(last)
			}
			last = now
			if err == nil && w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == 1 {
				converged = now.Sub(restored)
				return true, nil
			}
			return false, err
		})
	return converged, stale
}

func (p phaseRebuild) String() string {
	if !p.replaced {
		return fmt.Sprintf("not within %v", phaseWait)
	}
	return fmt.Sprintf("after %v", p.after.Round(time.Millisecond))
}

// rebuildByPhaseOfTheCut fails a trainer under restartPolicy Never at three moments of a cut of its node from the
// API server, the node imitating edgehub's late notice: in its first second (before edgehub noticed), just after
// edgehub noticed, and well into the cut; with the agent arming stand-ins ahead, or not.
func rebuildByPhaseOfTheCut(b testing.TB, armed bool) []phaseRebuild {
	b.Helper()
	if err := s.ArmStandIns("edge1", armed); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.ArmStandIns("edge1", false) }()
	if err := s.ImitateEdgehub("edge1", edgehubNotice, mirrorPodTimeout); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.ImitateEdgehub("edge1", 0, 0) }()
	var out []phaseRebuild
	for _, into := range []time.Duration{time.Second, edgehubNotice + 3*time.Second, 30 * time.Second} {
		// A job of its own for each: the controller sends one worker at most one command per 10 s, and a job
		// made again under one name has the same trainer names.
		name := fmt.Sprintf("never-written-%ds", int(into.Seconds()))
		if armed {
			name = fmt.Sprintf("never-armed-%ds", int(into.Seconds()))
		}
		after, replaced := failNeverTrainerCutOff(b, name, into, phaseWait, armed)
		out = append(out, phaseRebuild{into: into, after: after, replaced: replaced})
	}
	return out
}

// failNeverTrainerCutOff runs an FL job of that name whose trainers have restartPolicy Never, cuts trainer 0's node off from
// the API server, kills the trainer into the cut and says whether, and when, a trainer process of that job runs
// on the node again within limit. armed: the node's agent arms stand-ins, and the cut waits for the trainer's.
func failNeverTrainerCutOff(b testing.TB, name string, into, limit time.Duration, armed bool) (time.Duration, bool) {
	b.Helper()
	job, trainer := neverTrainerJob(b, name)
	defer deleteAndWait(b, job) // each run makes the job anew, under the same name
	if armed {
		harness.Eventually(b, within, "the trainer's stand-in armed", func(context.Context) (bool, error) {
			return s.StandInArmed("edge1", "default", trainer, "train-worker"), nil
		})
	}
	s.CutAPI("edge1")
	defer s.RestoreAPI("edge1")
	// How far into the cut the trainer fails is the measurement's variable, a time by definition: the phases are
	// times since the cut, and the edgehub the node imitates notices it on a timer of its own that nothing outside
	// the node tells.
	time.Sleep(into)
	if err := s.KillWorker("edge1", "default", trainer, "train-worker"); err != nil {
		b.Fatal(err)
	}
	killed := time.Now()
	var after time.Duration
	// Not replaced within limit is a result, not a failure.
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		running, err := trainerRunsOnEdge1(ctx, job, true)
		after = time.Since(killed)
		return err == nil && running, nil
	})
	if err != nil {
		return 0, false
	}
	return after, true
}

// trainerRunsOnEdge1 tells whether a trainer of job runs on edge1: in a pod of the job or, with standIns, as a
// pod's stand-in.
func trainerRunsOnEdge1(ctx context.Context, job client.Object, standIns bool) (bool, error) {
	pods := &corev1.PodList{}
	if err := s.Client.List(ctx, pods, client.InNamespace("default")); err != nil {
		return false, err
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, job.GetName()+"-train") && (s.WorkerRunning("edge1", "default", p.Name, "train-worker") ||
			standIns && s.StandInRunning("edge1", "default", p.Name, "train-worker")) {
			return true, nil
		}
	}
	return false, nil
}

// neverTrainerJob runs an FL job of that name whose trainers have restartPolicy Never and whose aggregator never
// ends, and returns it once trainer 0 (on edge1) runs, with that trainer's name.
func neverTrainerJob(b testing.TB, name string) (*v1alpha1.FederatedLearningJob, string) {
	b.Helper()
	job := apply(b, "federated-learning.yaml",
		func(o client.Object) {
			j := o.(*v1alpha1.FederatedLearningJob)
			j.SetName(name)
			j.Spec.AggregationWorker.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "exit_round", Value: "100000"}}
			for i := range j.Spec.TrainingWorkers {
				j.Spec.TrainingWorkers[i].Template.Spec.RestartPolicy = corev1.RestartPolicyNever
			}
		}).(*v1alpha1.FederatedLearningJob)
	trainer := fl.TrainerName(job.GetName(), 0)
	harness.Eventually(b, within, "trainer 0 running", func(context.Context) (bool, error) {
		return s.WorkerRunning("edge1", "default", trainer, "train-worker"), nil
	})
	return job, trainer
}

func killLittleModel(b testing.TB, pod *corev1.Pod) time.Time {
	b.Helper()
	waitRunning(b, pod)
	if err := s.KillWorker(edgeNode, "default", pod.Name, "little-model"); err != nil {
		b.Fatal(err)
	}
	return time.Now()
}

func waitRunning(b testing.TB, pod *corev1.Pod) {
	b.Helper()
	harness.Eventually(b, within, "the little model running", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
}

// duplicateWorkers counts little-model processes beyond one across every node and every pod.
func duplicateWorkers(b testing.TB) int {
	b.Helper()
	pods := &corev1.PodList{}
	if err := s.Client.List(context.Background(), pods, client.InNamespace("default")); err != nil {
		b.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		for _, n := range []string{"cloud", "edge1", "edge2", "edge3"} {
			if s.WorkerRunning(n, "default", p.Name, "little-model") {
				running++
			}
		}
	}
	return max(running-1, 0)
}
