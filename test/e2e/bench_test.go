package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/controllertest"
)

// Kills on a node cut off from the API server, and the anchors, measured on a connected node in the same run.
const (
	cutOffKills         = 50
	connectedKills      = 10
	kubeletRestartKills = 3
)

// BenchmarkCutOffNode kills the JI edge worker again and again on a node cut off from the API server and
// measures how fast the cloud's status shows it dead (detection) and how fast it runs again (rebuild), the
// time the status takes to converge once the link is back, and the workers found running twice. Anchors:
// detection on a connected node through the API server (what Kubernetes itself offers, and only while
// connected), and rebuild by the node's own restart policy (kubelet crash back-off, 10 s).
func BenchmarkCutOffNode(b *testing.B) {
	if testing.Short() {
		b.Skip("needs the simulation")
	}
	for range b.N {
		ji, pod := readyService(b)
		ctx := context.Background()
		s.CutAPI(edgeNode)
		waitEdgeWorker(b, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool {
			return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
		})
		var detection, rebuild []time.Duration
		for i := range cutOffKills {
			killed := killLittleModel(b, pod)
			var detected, running time.Duration
			for detected == 0 || running == 0 {
				if time.Since(killed) > within {
					b.Fatalf("kill %d: not detected and rebuilt within %v", i, within)
				}
				if w, err := edgeWorkerStatus(ctx, ji); detected == 0 && err == nil &&
					w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessDead {
					detected = time.Since(killed)
				}
				if running == 0 && s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") {
					running = time.Since(killed)
				}
				time.Sleep(10 * time.Millisecond)
			}
			detection, rebuild = append(detection, detected), append(rebuild, running)
			waitEdgeWorker(b, ji, "the worker alive again in the status", func(w v1alpha1.WorkerStatus) bool {
				return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
			})
		}
		restored := time.Now()
		s.RestoreAPI(edgeNode)
		waitEdgeWorker(b, ji, "the API server's status with every restart", func(w v1alpha1.WorkerStatus) bool {
			return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == cutOffKills
		})
		convergence := time.Since(restored)
		duplicates := duplicateWorkers(b)

		var apiDetection []time.Duration
		for range connectedKills {
			killed := killLittleModel(b, pod)
			controllertest.Eventually(b, within, "the API server showing the container stopped", func(ctx context.Context) (bool, error) {
				got := &corev1.Pod{}
				if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
					return false, err
				}
				cs := got.Status.ContainerStatuses
				return len(cs) == 1 && cs[0].State.Running == nil, nil
			})
			apiDetection = append(apiDetection, time.Since(killed))
			if err := s.RestartPod(edgeNode, "default", pod.Name); err != nil {
				b.Fatal(err)
			}
			waitRunning(b, pod)
		}
		var kubeletRebuild []time.Duration
		for range kubeletRestartKills {
			time.Sleep(11 * time.Second) // once it ran 10 s, the back-off starts again from its base
			killed := killLittleModel(b, pod)
			waitRunning(b, pod)
			kubeletRebuild = append(kubeletRebuild, time.Since(killed))
		}

		b.Run("detection", func(b *testing.B) {
			controllertest.ReportComparison(b, "Kill -> status shows the worker dead", "node cut off, agent's word", detection,
				"connected node, API server's word", apiDetection)
		})
		b.Run("rebuild", func(b *testing.B) {
			controllertest.ReportComparison(b, "Kill -> worker runs again", "node cut off, controller's command", rebuild,
				"node's restart policy (crash back-off)", kubeletRebuild)
		})
		b.ReportMetric(convergence.Seconds(), "reconnect-convergence-s")
		b.ReportMetric(float64(duplicates), "duplicates")
		fmt.Printf("\nReconnect after %d kills while cut off: status converged in %v (restarts counted: %d); duplicate workers: %d\n",
			cutOffKills, convergence.Round(time.Millisecond), cutOffKills, duplicates)
	}
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
	controllertest.Eventually(b, within, "the little model running", func(context.Context) (bool, error) {
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
