package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/realnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// runReal tells the story on real nodes: kubelets on their own containerd, Lifeline installed from the release
// make images-nodes built (packaged chart, image archives), the examples' sample worker images.
func runReal(ctx context.Context, exitAfter bool) error {
	if err := realnode.CheckMachine(); err != nil {
		return fmt.Errorf("this machine cannot run real nodes (%w); `make demo` tells the story on hollow nodes anywhere", err)
	}
	repo, err := testkit.RepoRoot()
	if err != nil {
		return err
	}
	release, err := realnode.FindRelease(repo)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "lln-demo-") // short: containerd's socket path in it is limited
	if err != nil {
		return err
	}
	say("Starting a control plane, one cloud node and two edge nodes: each a kubelet with its own containerd,")
	say("network and disk. Then Lifeline, installed from the release make built: its packaged chart and images ...")
	c, err := realnode.Start(ctx, realnode.Options{Dir: dir, Images: release.Images, Progress: os.Stdout})
	if err != nil {
		return err
	}
	defer func() {
		say("Stopping every node and process and removing %s ...", dir)
		c.Stop()
		_ = c.Remove()
	}()
	if err := realnode.PlaceExampleFiles(c); err != nil {
		return err
	}
	inst, err := realnode.InstallLifeline(ctx, c, realnode.InstallOptions{Chart: release.Chart, Progress: os.Stdout})
	if err != nil {
		return err
	}
	scheme, err := manager.Scheme()
	if err != nil {
		return err
	}
	kc, err := client.New(c.ControlPlane().Config, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	kubectl := filepath.Join(c.ControlPlane().BinDir, "kubectl")
	d := &demo{ctx: ctx, client: kc, vars: realnode.FixtureVars, patience: 5 * time.Minute,
		runKubectl: func(args ...string) (string, error) {
			out, err := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...).CombinedOutput()
			return string(out), err
		}}
	d.kubectl("get", "nodes", "-L", "node-role.kubernetes.io/edge")
	d.kubectl("get", "pods", "-n", realnode.Namespace, "-o", "wide")

	step("1. Apply the joint inference example, unchanged: its images are the sample worker under Sedna's names")
	ji, err := d.applyJI()
	if err != nil {
		return err
	}
	if err := d.waitFor("the JointInferenceService to be Ready", func() bool {
		got := &v1alpha1.JointInferenceService{}
		return kc.Get(ctx, client.ObjectKeyFromObject(ji), got) == nil &&
			meta.IsStatusConditionTrue(got.Status.Conditions, jointinference.ConditionReady)
	}); err != nil {
		return err
	}
	d.kubectl("get", "pods", "-o", "wide")
	d.showEdgeWorker(ji)

	step("2. edge-1 loses the API server, then its edge worker's process is killed")
	if err := d.realKillCutOff(c, inst, ji); err != nil {
		return err
	}

	step("3. edge-1, cut off from everything, reboots")
	if err := d.realRebootCutOff(c, inst, ji); err != nil {
		return err
	}

	step("The story is told.")
	if exitAfter {
		return nil
	}
	say("The cluster stays up:")
	say("  export KUBECONFIG=%s", c.Kubeconfig)
	say("  %s get ji,pods -o wide", kubectl)
	say("Logs: %s/control-plane/*.log, %s/nodes/<node>/var/log/pods", dir, dir)
	say("Stop with Ctrl-C or `make demo-down`.")
	<-ctx.Done()
	return nil
}

// realKillCutOff kills the edge worker's process on edge-1 while the node cannot reach the API server: the
// agent tells the death, the kubelet restarts it.
func (d *demo) realKillCutOff(c *realnode.Cluster, inst *realnode.Installation, ji *v1alpha1.JointInferenceService) error {
	if err := c.Cut(d.ctx, "edge-1", realnode.LinkAPI, inst.BrokerPort); err != nil {
		return err
	}
	if err := d.waitFor("the agent to tell the worker's state in the API server's place", func() bool {
		return d.edgeWorkerStatus(ji).Source == v1alpha1.StatusSourceAgent
	}); err != nil {
		return err
	}
	pod, err := d.edgeWorkerPod()
	if err != nil {
		return err
	}
	if _, err := c.Node("edge-1").KillContainer(d.ctx, pod.Name, pod.Spec.Containers[0].Name); err != nil {
		return err
	}
	killed := time.Now()
	if err := d.waitFor("the status to show the death", func() bool {
		return d.edgeWorkerStatus(ji).Liveness != v1alpha1.LivenessAlive
	}); err != nil {
		return err
	}
	say("Killed -> the cloud shows it in %.1fs, though the kubelet cannot tell the API server anything now:", time.Since(killed).Seconds())
	d.showEdgeWorker(ji)
	if err := d.waitFor("the kubelet to restart it (its own crash back-off)", func() bool {
		w := d.edgeWorkerStatus(ji)
		return w.Liveness == v1alpha1.LivenessAlive && w.Restarts >= 1
	}); err != nil {
		return err
	}
	d.showEdgeWorker(ji)
	say("Mending the link.")
	return c.Mend(d.ctx, "edge-1")
}

// realRebootCutOff reboots edge-1 while it is cut off: its kubelet runs only its static pods, the agent's
// standby among them, which brings the edge worker back as a stand-in; once the link returns the stand-in gives
// way to the worker's own pod.
func (d *demo) realRebootCutOff(c *realnode.Cluster, inst *realnode.Installation, ji *v1alpha1.JointInferenceService) error {
	pod, err := d.edgeWorkerPod()
	if err != nil {
		return err
	}
	edge := c.Node("edge-1")
	running := func(prefix string) int {
		n, _ := edge.RunningContainers(d.ctx, prefix)
		return n
	}
	if err := c.Cut(d.ctx, "edge-1", realnode.LinkAll, inst.BrokerPort); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // the agent's probe learns the node is cut off
	if err := c.Reboot(d.ctx, "edge-1"); err != nil {
		return err
	}
	booted := time.Now()
	say("A kubelet that boots cut off knows none of the pods the API server gave it, the agent's DaemonSet pod included;")
	say("it runs only its static pods, among them the agent's standby, which the agent pod installed.")
	if err := d.waitFor("the edge worker to run again on edge-1, as a static pod the standby wrote", func() bool {
		n, _ := edge.StandInContainers(d.ctx, pod.Name)
		return n == 1
	}); err != nil {
		return err
	}
	say("Rebooted cut off -> the edge worker runs again %.0fs after the boot (most of it the kubelet's own waits on the dead link).",
		time.Since(booted).Seconds())
	say("Mending the links.")
	if err := c.Mend(d.ctx, "edge-1"); err != nil {
		return err
	}
	mended := time.Now()
	if err := d.waitFor("the stand-in to give way to the worker's own pod, and the agent pod to be back", func() bool {
		n, _ := edge.StandInContainers(d.ctx, pod.Name)
		return n == 0 && running(pod.Name) == 1 && running("lifeline-agent-") >= 2
	}); err != nil {
		return err
	}
	say("Link back -> the stand-in gave way to the worker's own pod %.1fs later.", time.Since(mended).Seconds())
	return d.waitFor("the edge worker Alive in the status", func() bool {
		return d.edgeWorkerStatus(ji).Liveness == v1alpha1.LivenessAlive
	})
}
