package realnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/realnode"
)

// BenchmarkRealNodes measures, on the real nodes, what Lifeline gives a node cut off from the cloud, each figure
// beside the same run's anchor, the kubelet alone, as `name value unit` lines:
//   - the edge node's link to the API server drops its packets -> the status says the worker in the agent's word;
//   - kill of the joint inference edge worker -> the status shows the death (Dead, or one restart more): on a
//     node cut off from the API server (the agent's word) and, as the anchor, on a connected one (the kubelet's
//     word through the API server);
//   - an FL trainer under restartPolicy Never fails on a node cut off from everything -> a trainer runs again
//     (anchor: the kubelet never runs it again); the link back -> its stand-in gives way; seconds with no trainer,
//     and with two, meanwhile;
//   - the joint inference edge worker's node reboots while cut off from everything -> the edge worker runs again
//     (anchor: the kubelet runs none of its API pods until the link returns), once: a reboot costs minutes;
//   - helm upgrade to a new tag of both images while edge-2 is cut off: workers restarted, reports lost, and how
//     long until every agent of the new release is ready.
func BenchmarkRealNodes(b *testing.B) {
	needReal(b)
	const samples = 3
	jointInferenceReady(b)
	ctx := context.Background()
	// Each kill is of a fresh pod, so that the kubelet's crash back-off, which grows with every crash of a
	// container, is the same for every sample.
	var connected, cutOff, told []time.Duration
	for range samples {
		freshEdgeWorker(b)
		connected = append(connected, timeToTellDeath(b))
	}
	for range samples {
		freshEdgeWorker(b)
		if err := rc.Cut(ctx, "edge-1", realnode.LinkAPI, inst.BrokerPort); err != nil {
			b.Fatal(err)
		}
		cutAt := time.Now()
		waitEdgeWorker(b, 30*time.Second, "told by the agent", func(w *v1alpha1.WorkerStatus) bool {
			return w.Source == v1alpha1.StatusSourceAgent
		})
		told = append(told, time.Since(cutAt))
		cutOff = append(cutOff, timeToTellDeath(b))
		if err := rc.Mend(ctx, "edge-1"); err != nil {
			b.Fatal(err)
		}
	}
	var rebuilt, gaveWay []time.Duration
	var gap, overlap time.Duration
	for i := range samples {
		h := failNeverTrainerCutOff(b, fmt.Sprintf("bench-never-%d", i))
		rebuilt, gaveWay = append(rebuilt, h.rebuilt), append(gaveWay, h.gaveWay)
		gap, overlap = gap+h.gap, overlap+h.overlap
	}
	reboot := rebootCutOff(b)
	upgraded := upgradeWhileCutOff(b, "0.0.0-bench")
	line := func(name string, d time.Duration) { fmt.Printf("%s %.3f s\n", name, d.Seconds()) }
	fmt.Printf("\nreal nodes, %d samples each (p99 of %d is their worst)\n", samples, samples)
	line("cut-told-p50", harness.Percentile(told, 50))
	line("cut-told-p99", harness.Percentile(told, 99))
	fmt.Println("cut-told-anchor never (the API server keeps the kubelet's last word; only the Node turns NotReady, after the node-monitor grace period)")
	line("detect-cut-off-p50", harness.Percentile(cutOff, 50))
	line("detect-cut-off-p99", harness.Percentile(cutOff, 99))
	line("detect-connected-anchor-p50", harness.Percentile(connected, 50))
	line("detect-connected-anchor-p99", harness.Percentile(connected, 99))
	line("rebuild-never-trainer-cut-off-p50", harness.Percentile(rebuilt, 50))
	line("rebuild-never-trainer-cut-off-p99", harness.Percentile(rebuilt, 99))
	fmt.Println("rebuild-never-trainer-anchor never (the kubelet does not run a failed Never container again)")
	line("reconnect-stand-in-gave-way-p99", harness.Percentile(gaveWay, 99))
	line("reconnect-no-trainer-running", gap)
	line("reconnect-two-trainers-running", overlap)
	line("reboot-cut-off-worker-back", reboot.rebuilt)
	fmt.Println("reboot-cut-off-anchor never (until the link returns: the kubelet knows none of its API pods)")
	line("reboot-reconnect-stand-in-gave-way", reboot.gaveWay)
	line("reboot-reconnect-no-worker-running", reboot.gap)
	line("reboot-reconnect-two-workers-running", reboot.overlap)
	fmt.Printf("helm-upgrade-workers-restarted %d\n", len(upgraded.Restarted))
	fmt.Printf("helm-upgrade-reports-lost %d (delivered after a retry: %d)\n", len(upgraded.Lost), upgraded.ReportsRetried)
	for _, l := range upgraded.Lost {
		fmt.Println("  " + l)
	}
	line("helm-upgrade-every-agent-ready", upgraded.Took)
	fmt.Printf("helm-upgrade-hand-overs %d of %d (the new agent started beside the old one and took the node from it)\n", upgraded.HandOvers, upgraded.Agents)
	fmt.Println("helm-upgrade-anchor none (Sedna's controllers have no agent to upgrade)")
}

// freshEdgeWorker deletes the joint inference edge worker's pod and waits until its replacement is Alive.
func freshEdgeWorker(b testing.TB) {
	b.Helper()
	ctx := context.Background()
	old, err := edgeWorker(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := kc.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: old.Name}}); err != nil {
		b.Fatal(err)
	}
	waitEdgeWorker(b, 2*time.Minute, "a new pod, Alive from the API server", func(w *v1alpha1.WorkerStatus) bool {
		return w.Name != old.Name && w.Liveness == v1alpha1.LivenessAlive && w.Source == v1alpha1.StatusSourceAPIServer
	})
}

// timeToTellDeath kills the joint inference edge worker and returns how long until its status shows the death:
// Dead, or one restart more. It waits for the worker to be Alive first.
func timeToTellDeath(b testing.TB) time.Duration {
	b.Helper()
	waitEdgeWorker(b, time.Minute, "Alive", func(w *v1alpha1.WorkerStatus) bool { return w.Liveness == v1alpha1.LivenessAlive })
	before, err := edgeWorker(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	killed := killEdgeWorker(b)
	waitEdgeWorker(b, time.Minute, "dead or restarted", func(w *v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessDead || w.Restarts > before.Restarts
	})
	return time.Since(killed)
}
