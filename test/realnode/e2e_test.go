package realnode_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/edge/standin"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/realnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var (
	rc         *realnode.Cluster
	kc         client.Client
	inst       *realnode.Installation
	skipReason string
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	os.Exit(runReal(m))
}

func runReal(m *testing.M) int {
	if testing.Short() {
		skipReason = "needs real nodes (run without -short)"
		return m.Run()
	}
	if err := realnode.CheckMachine(); err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "real nodes:", err)
			return 1
		}
		skipReason = "this machine cannot run real nodes: " + err.Error()
		return m.Run()
	}
	repo, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	release, err := realnode.FindRelease(repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "real nodes:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "lln-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	// A short node-monitor grace: a node cut off for long is tainted within the test's time.
	rc, err = realnode.Start(ctx, realnode.Options{Dir: dir, Images: release.Images,
		NodeMonitorGracePeriod: 20 * time.Second})
	if err == nil {
		err = realnode.PlaceExampleFiles(rc)
	}
	if err == nil {
		inst, err = realnode.InstallLifeline(ctx, rc, realnode.InstallOptions{Chart: release.Chart})
	}
	if err == nil {
		s, serr := manager.Scheme()
		if serr != nil {
			err = serr
		} else {
			kc, err = client.New(rc.ControlPlane().Config, client.Options{Scheme: s})
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "real nodes:", err)
		if rc != nil {
			rc.Stop()
		}
		fmt.Fprintf(os.Stderr, "real nodes' logs kept in %s\n", dir)
		return 1
	}
	code := m.Run()
	rc.Stop()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "real nodes' logs kept in %s (control-plane/*.log, nodes/*/var/log/pods)\n", dir)
	} else {
		_ = rc.Remove()
	}
	return code
}

func needReal(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// apply creates an example's objects in the default namespace, placeholders set to the real nodes, as
// `envsubst < deploy/examples/<file> | kubectl apply -f -` would, and returns its service or job.
func apply(t testing.TB, file string) client.Object {
	t.Helper()
	objs, err := testkit.Objects(file, realnode.FixtureVars)
	if err != nil {
		t.Fatal(err)
	}
	var main client.Object
	for _, obj := range objs {
		obj.SetNamespace("default")
		if err := kc.Create(context.Background(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %s of %s: %v", obj.GetName(), file, err)
		}
		switch obj.(type) {
		case *v1alpha1.JointInferenceService, *v1alpha1.FederatedLearningJob:
			main = obj
		}
	}
	return main
}

const jiName = "helmet-detection-inference-example"

// edgeWorker is the joint inference example's edge worker as its status says.
func edgeWorker(ctx context.Context) (*v1alpha1.WorkerStatus, error) {
	ji := &v1alpha1.JointInferenceService{}
	if err := kc.Get(ctx, client.ObjectKey{Namespace: "default", Name: jiName}, ji); err != nil {
		return nil, err
	}
	for i := range ji.Status.Workers {
		if ji.Status.Workers[i].Role == "edge" {
			return &ji.Status.Workers[i], nil
		}
	}
	return nil, fmt.Errorf("no edge worker in the status")
}

func TestJointInferenceExampleIsReadyWithTheSampleImages(t *testing.T) {
	needReal(t)
	jointInferenceReady(t)
}

// jointInferenceReady applies the joint inference example, unless an earlier test did, and waits until it is Ready
// with both workers Alive.
func jointInferenceReady(t testing.TB) {
	t.Helper()
	apply(t, "joint-inference.yaml")
	harness.Eventually(t, 3*time.Minute, "the joint inference example Ready, both workers Alive", func(ctx context.Context) (bool, error) {
		ji := &v1alpha1.JointInferenceService{}
		if err := kc.Get(ctx, client.ObjectKey{Namespace: "default", Name: jiName}, ji); err != nil {
			return false, err
		}
		alive := 0
		for _, w := range ji.Status.Workers {
			if w.Liveness == v1alpha1.LivenessAlive && w.Phase == string(corev1.PodRunning) {
				alive++
			}
		}
		return meta.IsStatusConditionTrue(ji.Status.Conditions, "Ready") && alive == 2, nil
	})
}

func TestFederatedLearningExampleSucceedsWithTheSampleImages(t *testing.T) {
	needReal(t)
	job := apply(t, "federated-learning.yaml")
	harness.Eventually(t, 4*time.Minute, "the federated learning example Succeeded", func(ctx context.Context) (bool, error) {
		fl := &v1alpha1.FederatedLearningJob{}
		if err := kc.Get(ctx, client.ObjectKeyFromObject(job), fl); err != nil {
			return false, err
		}
		if fl.Status.Phase == v1alpha1.FLJobFailed {
			return false, fmt.Errorf("the job failed: %+v", fl.Status)
		}
		return fl.Status.Phase == v1alpha1.FLJobSucceeded, nil
	})
}

// killEdgeWorker kills the joint inference example's edge worker's process on edge-1 and returns when.
func killEdgeWorker(t testing.TB) time.Time {
	t.Helper()
	p := edgeWorkerPod(t)
	if _, err := rc.Node("edge-1").KillContainer(context.Background(), p.Name, p.Spec.Containers[0].Name); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

func TestKilledWorkerIsCountedAndTheKubeletRestartsIt(t *testing.T) {
	needReal(t)
	jointInferenceReady(t)
	waitEdgeWorker(t, time.Minute, "Alive from the API server", func(w *v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive && w.Source == v1alpha1.StatusSourceAPIServer
	})
	before, err := edgeWorker(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	killEdgeWorker(t)
	waitEdgeWorker(t, 30*time.Second, "a restart more, Alive again", func(w *v1alpha1.WorkerStatus) bool {
		return w.Restarts > before.Restarts && w.Liveness == v1alpha1.LivenessAlive
	})
}

func TestKilledWorkerOnANodeCutOffFromTheAPIServerIsToldByTheAgent(t *testing.T) {
	needReal(t)
	jointInferenceReady(t)
	ctx := context.Background()
	if err := rc.Cut(ctx, "edge-1", realnode.LinkAPI, inst.BrokerPort); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rc.Mend(ctx, "edge-1") })
	cutAt := time.Now()
	waitEdgeWorker(t, 10*time.Second, "told by the agent (its probe of the API server)", func(w *v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAgent
	})
	t.Logf("status from the agent %.1fs after the cut", time.Since(cutAt).Seconds())
	before, err := edgeWorker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The second crash meets the kubelet's 10 s back-off: the worker stays dead long enough to be seen so.
	killedAt := killEdgeWorker(t)
	waitEdgeWorker(t, 30*time.Second, "a restart more, Alive again, from the agent", func(w *v1alpha1.WorkerStatus) bool {
		return w.Restarts > before.Restarts && w.Liveness == v1alpha1.LivenessAlive && w.Source == v1alpha1.StatusSourceAgent
	})
	t.Logf("restarted and told %.1fs after the kill", time.Since(killedAt).Seconds())
	killedAt = killEdgeWorker(t)
	waitEdgeWorker(t, 2*time.Second, "Dead, from the agent", func(w *v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessDead && w.Source == v1alpha1.StatusSourceAgent
	})
	t.Logf("dead told %.2fs after the kill", time.Since(killedAt).Seconds())
	waitEdgeWorker(t, 30*time.Second, "Alive again after the kubelet's back-off", func(w *v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive
	})
	if err := rc.Mend(ctx, "edge-1"); err != nil {
		t.Fatal(err)
	}
	waitEdgeWorker(t, time.Minute, "from the API server again", func(w *v1alpha1.WorkerStatus) bool {
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive
	})
}

func waitEdgeWorker(t testing.TB, within time.Duration, what string, ok func(*v1alpha1.WorkerStatus) bool) {
	t.Helper()
	harness.Eventually(t, within, "the edge worker "+what, func(ctx context.Context) (bool, error) {
		w, err := edgeWorker(ctx)
		if err != nil {
			return false, err
		}
		return ok(w), nil
	})
}

// TestFailedTrainerOnANodeCutOffFromEverythingRunsAgainAsAStaticPod: a trainer under restartPolicy Never fails
// on a node cut off from the API server and the broker; the kubelet will never run it again, the agent does, as a
// static pod of the real kubelet; once the link is back, the static pod gives way to the trainer's replacement,
// with no moment when no trainer runs.
func TestFailedTrainerOnANodeCutOffFromEverythingRunsAgainAsAStaticPod(t *testing.T) {
	needReal(t)
	h := failNeverTrainerCutOff(t, "surface-defect-detection-never")
	t.Logf("the trainer ran again %.1fs after it failed, cut off; the static pod gave way %.1fs after the link returned; "+
		"no trainer ran for %v, two ran for %v", h.rebuilt.Seconds(), h.gaveWay.Seconds(), h.gap, h.overlap)
	if h.gap > 0 {
		t.Errorf("no trainer ran for %v during the hand-over", h.gap)
	}
	if h.overlap > 2*time.Second {
		t.Errorf("two trainers of the same worker ran for %v", h.overlap)
	}
}

// handOver is what one rebuild on a cut-off node shows: how long after the failure (or the node's boot) the
// worker's stand-in ran, how long after the link returned the stand-in gave way, and meanwhile how long no
// instance of the worker, or two, ran.
type handOver struct {
	rebuilt, gaveWay, gap, overlap time.Duration
}

// failNeverTrainerCutOff runs an FL job named name whose trainers have restartPolicy Never, cuts edge-1 (trainer
// 0's node) off from everything, kills trainer 0, waits for its stand-in, mends the node and waits for the
// stand-in to give way; the job is deleted at the end.
func failNeverTrainerCutOff(t testing.TB, name string) handOver {
	t.Helper()
	ctx := context.Background()
	job, err := realnode.CreateNeverTrainerJob(ctx, kc, name)
	if err != nil {
		t.Fatal(err)
	}
	defer deleteAndWait(t, job)
	trainer := fl.TrainerName(job.Name, 0)
	edge := rc.Node("edge-1")
	harness.Eventually(t, 2*time.Minute, "trainer 0 running on edge-1", func(ctx context.Context) (bool, error) {
		n, err := edge.RunningContainers(ctx, trainer)
		return n == 1, err
	})
	// The agent learns a pod from its watch of the API server: one bound while that watch is being made again
	// (as after the last test's mend) and cut off before it is made, the agent never hears of. Its stand-in,
	// armed, says the agent follows it.
	harness.Eventually(t, 30*time.Second, "trainer 0's stand-in armed by edge-1's agent", func(context.Context) (bool, error) {
		return slices.ContainsFunc(standIns(t, edge), func(s standIn) bool { return s.pod.Name == trainer && !s.standing }), nil
	})
	// As stock monitoring must see it: Running, not Ready, its container at the gate, nothing restarted.
	harness.Eventually(t, time.Minute, "trainer 0's armed stand-in Running, not Ready", func(ctx context.Context) (bool, error) {
		err := rc.ArmedStandInQuiet(ctx, "default", trainer, "edge-1")
		return err == nil, err
	})
	cutOffKnown(t, "edge-1", "trainer 0's status from the agent", func(ctx context.Context) (bool, error) {
		got := &v1alpha1.FederatedLearningJob{}
		if err := kc.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return false, err
		}
		for _, w := range got.Status.Workers {
			if w.Name == trainer {
				return w.Source == v1alpha1.StatusSourceAgent, nil
			}
		}
		return false, nil
	})
	defer func() { _ = rc.Mend(ctx, "edge-1") }()
	if _, err := edge.KillContainer(ctx, trainer, job.Spec.TrainingWorkers[0].Template.Spec.Containers[0].Name); err != nil {
		t.Fatal(err)
	}
	var h handOver
	killed := time.Now()
	waitStandIn(t, trainer, 90*time.Second)
	h.rebuilt = time.Since(killed)
	mendAndHandBack(t, trainer, &h, nil)
	return h
}

// cutOffKnown cuts node off from everything, its agent knowing it: first from the API server, until told holds
// (the controller taking the agent's word, which it does once the agent says its node is cut off), then from
// the rest. The node is mended when the test ends, whatever happens.
func cutOffKnown(t testing.TB, node, what string, told func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { _ = rc.Mend(ctx, node) })
	if err := rc.Cut(ctx, node, realnode.LinkAPI, inst.BrokerPort); err != nil {
		t.Fatal(err)
	}
	known := false
	defer func() {
		if !known { // the wait failed the test: its output keeps the logs, the pods' own go with them when the run ends
			t.Logf("the controller:\n%s\nthe agents:\n%s", rc.ComponentLogs(ctx, "lifeline-controller"), rc.ComponentLogs(ctx, "lifeline-agent"))
		}
	}()
	harness.Eventually(t, 30*time.Second, what+": "+node+"'s agent knows it is cut off", told)
	known = true
	if err := rc.Cut(ctx, node, realnode.LinkAll, inst.BrokerPort); err != nil {
		t.Fatal(err)
	}
}

// waitStandIn waits until a stand-in of the worker whose pod is named worker runs on edge-1.
func waitStandIn(t testing.TB, worker string, within time.Duration) {
	t.Helper()
	harness.Eventually(t, within, worker+"'s stand-in running on edge-1", func(ctx context.Context) (bool, error) {
		n, err := rc.Node("edge-1").StandInContainers(ctx, worker)
		return n == 1, err
	})
}

// mendAndHandBack mends edge-1 and waits until the stand-in of the worker whose pods are named worker* has given
// way to one pod of the worker, no stand-in is left in the node's manifest directory and done (when given)
// holds; it measures the hand-over into h.
func mendAndHandBack(t testing.TB, worker string, h *handOver, done func() bool) {
	t.Helper()
	edge := rc.Node("edge-1")
	if err := rc.Mend(context.Background(), "edge-1"); err != nil {
		t.Fatal(err)
	}
	mended, last := time.Now(), time.Now()
	harness.Eventually(t, 3*time.Minute, "the stand-in given way to a pod of "+worker, func(ctx context.Context) (bool, error) {
		running, err := edge.RunningContainers(ctx, worker) // its own pods' and its stand-ins' (<name>-edge-1, <name>-b-edge-1)
		if err != nil {
			return false, err
		}
		static, err := edge.StandInContainers(ctx, worker)
		if err != nil {
			return false, err
		}
		now := time.Now()
		switch {
		case running == 0:
			h.gap += now.Sub(last)
		case running > 1:
			h.overlap += now.Sub(last)
		}
		last = now
		standing := slices.ContainsFunc(standIns(t, edge), func(s standIn) bool { return s.standing })
		return static == 0 && !standing && running == 1 && (done == nil || done()), nil
	})
	h.gaveWay = time.Since(mended)
}

// standIn is a stand-in in a node's manifest directory: its pod, and whether it stands in for its worker
// (written by a rebuild, or armed with its gate open). An armed stand-in whose gate is closed waits for a rebuild:
// it is no instance of its worker, and one is armed again after every hand-back.
type standIn struct {
	pod      corev1.Pod
	standing bool
}

// standIns reads the stand-ins in the node's manifest directory.
func standIns(t testing.TB, n *realnode.Node) []standIn {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(n.Disk, realnode.StaticPodDir, "lifeline-*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []standIn
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // removed meanwhile
		}
		var s standIn
		if err := json.Unmarshal(data, &s.pod); err != nil {
			t.Fatalf("stand-in %s: %v", f, err)
		}
		gate := s.pod.Annotations[standin.ArmedAnnotation]
		_, err = os.Stat(filepath.Join(n.Disk, gate, "open"))
		s.standing = gate == "" || err == nil
		out = append(out, s)
	}
	return out
}

// TestNodeRebootedWhileCutOffGetsItsWorkersBack: edge-1 reboots while cut off from everything. Its kubelet then
// knows none of its pods, the agent's DaemonSet pod included, and runs only its static pods: the agent's standby
// among them, which rebuilds the joint inference example's edge worker from what the agent kept on the node's
// disk. Once the link returns, the agent pod runs again, the standby gives way, and the stand-in gives way to the
// worker's own pod, with no moment when no edge worker runs.
func TestNodeRebootedWhileCutOffGetsItsWorkersBack(t *testing.T) {
	needReal(t)
	h := rebootCutOff(t)
	t.Logf("the edge worker ran again %.1fs after the cut-off node booted; the stand-in gave way %.1fs after the link returned; "+
		"no edge worker ran for %v, two ran for %v", h.rebuilt.Seconds(), h.gaveWay.Seconds(), h.gap, h.overlap)
	if h.gap > 0 {
		t.Errorf("no edge worker ran for %v during the hand-over", h.gap)
	}
	if _, err := os.Stat(filepath.Join(rc.Node("edge-1").Disk, realnode.StaticPodDir, "lifeline-agent-standby.yaml")); err != nil {
		t.Errorf("the standby is gone after the reboot: %v", err)
	}
	waitEdgeWorker(t, time.Minute, "Alive and Running after the reboot", func(w *v1alpha1.WorkerStatus) bool {
		return w.Liveness == v1alpha1.LivenessAlive && w.Phase == string(corev1.PodRunning)
	})
}

// rebootCutOff makes the joint inference example Ready, cuts edge-1 (its edge worker's node) off from
// everything, reboots it, waits for the edge worker's stand-in, mends the node and waits until the stand-in has
// given way to the worker's own pod and both agents of the node run: rebuilt is measured from the boot.
func rebootCutOff(t testing.TB) handOver {
	t.Helper()
	jointInferenceReady(t)
	ctx := context.Background()
	edge := rc.Node("edge-1")
	worker := edgeWorkerPod(t).Name
	standby := filepath.Join(edge.Disk, realnode.StaticPodDir, "lifeline-agent-standby.yaml")
	harness.Eventually(t, time.Minute, "the agent's standby installed on edge-1", func(ctx context.Context) (bool, error) {
		_, err := os.Stat(standby)
		return err == nil, nil
	})
	cutOffKnown(t, "edge-1", "the edge worker's status from the agent", func(ctx context.Context) (bool, error) {
		w, err := edgeWorker(ctx)
		return err == nil && w.Source == v1alpha1.StatusSourceAgent, err
	})
	defer func() { _ = rc.Mend(ctx, "edge-1") }()
	if err := rc.Reboot(ctx, "edge-1"); err != nil {
		t.Fatal(err)
	}
	var h handOver
	booted := time.Now()
	// A kubelet booted cut off starts its static pods only after its own waits on the dead link (the volumes of
	// the pods it ran before the reboot among them): about a minute and a half here.
	waitStandIn(t, worker, 4*time.Minute)
	h.rebuilt = time.Since(booted)
	// The kubelet starts the node's static pods, the standby and the stand-ins, in no set order.
	harness.Eventually(t, 30*time.Second, "the standby running on edge-1", func(ctx context.Context) (bool, error) {
		n, err := edge.RunningContainers(ctx, "lifeline-agent-standby")
		return n == 1, err
	})
	mendAndHandBack(t, worker, &h, func() bool {
		pods, err := rc.ComponentPods(ctx, "lifeline-agent")
		if err != nil {
			t.Fatal(err)
		}
		agents := 0
		for name, ready := range pods {
			if ready && strings.HasPrefix(name, "lifeline-agent-") {
				agents++
			}
		}
		return agents == 2
	})
	return h
}

// edgeWorkerPod is the joint inference example's edge worker pod on edge-1.
func edgeWorkerPod(t testing.TB) *corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := kc.List(context.Background(), pods, client.InNamespace("default"),
		client.MatchingLabels{"jointinferenceservice.sedna.io/name": jiName}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		// An armed stand-in's mirror pod carries the worker's labels; its worker waits behind the gate.
		if p.Spec.NodeName == "edge-1" && p.DeletionTimestamp == nil && !contract.IsMirrorPod(&p) {
			return &p
		}
	}
	t.Fatal("no edge worker pod on edge-1")
	return nil
}

// deleteAndWait deletes obj in the foreground and waits until it is gone, its pods with it.
func deleteAndWait(t testing.TB, obj client.Object) {
	t.Helper()
	if err := kc.Delete(context.Background(), obj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		if !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		return
	}
	harness.Eventually(t, 2*time.Minute, obj.GetName()+" gone", func(ctx context.Context) (bool, error) {
		err := kc.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// helm upgrade to a new tag of both images, one edge node cut off from everything meanwhile: no worker restarts,
// no report is lost (Sedna's library tries one for 12 s; the old agent hands the node to the new one, which
// starts beside it), and the standby follows the new image.
func TestHelmUpgradeWhileANodeIsCutOffRestartsNoWorker(t *testing.T) {
	needReal(t)
	jointInferenceReady(t)
	u := upgradeWhileCutOff(t, "0.0.0-upgrade")
	for _, w := range u.Restarted {
		t.Errorf("worker restarted by the upgrade: %s", w)
	}
	if len(u.Lost) != 0 {
		t.Errorf("%d reports lost while the agents were replaced:\n%s\nthe agents:\n%s", len(u.Lost), strings.Join(u.Lost, "\n"),
			rc.ComponentLogs(context.Background(), "lifeline-agent"))
	}
	if !u.StandbyFollowed {
		t.Error("edge-1's standby is not of the new release")
	}
	t.Logf("upgrade: every agent of the new release ready after %v, %d of them handed the node by the old one; %d reports delivered after a retry, %d lost",
		u.Took.Round(time.Second), u.HandOvers, u.ReportsRetried, len(u.Lost))
}

// upgradeWhileCutOff upgrades the release to tag for both images while edge-2 is cut off from everything, watching
// the joint inference example's workers (realnode.UpgradeWhileCutOff).
func upgradeWhileCutOff(t testing.TB, tag string) realnode.Upgrade {
	t.Helper()
	u, err := realnode.UpgradeWhileCutOff(context.Background(), rc, inst, kc, realnode.UpgradeOptions{
		Tag: tag, CutNode: "edge-2", Service: client.ObjectKey{Namespace: "default", Name: jiName}})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestHelmUninstallLeavesNoLifelineObject runs last: it removes Lifeline.
func TestHelmUninstallLeavesNoLifelineObject(t *testing.T) {
	needReal(t)
	ctx := context.Background()
	if _, err := rc.Helm(ctx, "uninstall", inst.Release, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	cs := rc.Client()
	selector := metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=lifeline"}
	harness.Eventually(t, 2*time.Minute, "no Lifeline pod left", func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(realnode.Namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, err
	})
	if l, err := cs.RbacV1().ClusterRoles().List(ctx, selector); err != nil || len(l.Items) != 0 {
		t.Errorf("cluster roles left: %v %v", l, err)
	}
	// What the controller made at run time, the broker's CA and its ConfigMap, stays (the agents' trust root follows
	// no object that may be made again); nothing else of Lifeline's does.
	secrets, err := cs.CoreV1().Secrets(realnode.Namespace).List(ctx, selector)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := cs.CoreV1().ConfigMaps(realnode.Namespace).List(ctx, selector)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, s := range secrets.Items {
		left = append(left, "Secret "+s.Name)
	}
	for _, m := range maps.Items {
		left = append(left, "ConfigMap "+m.Name)
	}
	if want := []string{"Secret lifeline-broker-ca-key", "ConfigMap lifeline-broker-ca"}; !slices.Equal(left, want) {
		t.Errorf("left after helm uninstall: %v, want the broker's CA alone: %v", left, want)
	}
	if l, err := cs.RbacV1().ClusterRoleBindings().List(ctx, selector); err != nil || len(l.Items) != 0 {
		t.Errorf("cluster role bindings left: %v %v", l, err)
	}
	pods := &corev1.PodList{}
	if err := kc.List(ctx, pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, f := range p.Finalizers {
			if strings.Contains(f, "lifeline") {
				t.Errorf("pod %s/%s still has finalizer %s", p.Namespace, p.Name, f)
			}
		}
	}
	for _, n := range rc.Nodes {
		left, _ := filepath.Glob(filepath.Join(n.Disk, realnode.StaticPodDir, "lifeline-*"))
		if len(left) != 0 {
			t.Errorf("node %s: static pods left: %v", n.Name, left)
		}
	}
}
