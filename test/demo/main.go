// Command lifeline-demo runs Lifeline on a simulated edge and narrates what it does: `make demo`.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

func main() {
	exitAfter := flag.Bool("exit", false, "stop everything once the story is told instead of leaving it running")
	onRealNodes := flag.Bool("real", false, "tell the story on real nodes (kubelet and containerd; root): see docs/operations.md")
	pidFile := flag.String("pid-file", "", "write this process's pid here, for `make demo-down`")
	flag.Parse()
	if *pidFile != "" {
		_ = os.WriteFile(*pidFile, []byte(fmt.Sprint(os.Getpid())), 0o644)
		defer os.Remove(*pidFile)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tell := run
	if *onRealNodes {
		tell = runReal
	}
	if err := tell(ctx, *exitAfter); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type demo struct {
	ctx    context.Context
	s      *harness.Sim // the hollow nodes; nil on real nodes
	client client.Client
	// vars are the examples' placeholders, set to the nodes' names.
	vars map[string]string
	// runKubectl runs kubectl on the demo's cluster.
	runKubectl func(args ...string) (string, error)
	// patience bounds each wait.
	patience time.Duration
}

func run(ctx context.Context, exitAfter bool) error {
	say("Starting a control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler),")
	say("lifeline-controller, one hollow cloud node and three hollow KubeEdge edge nodes ...")
	// The kubelet's crash back-off (10 s), so the node's own restart and Lifeline's are told apart.
	s, err := harness.StartSim(ctx, harness.SimOptions{CrashBackoff: 10 * time.Second})
	if err != nil {
		return err
	}
	defer s.Stop()
	d := &demo{ctx: ctx, s: s, client: s.Client, vars: harness.FixtureVars, runKubectl: s.Kubectl, patience: 2 * time.Minute}
	d.kubectl("get", "nodes", "-L", "node-role.kubernetes.io/edge")

	step("1. Apply two of Lifeline's examples, in Sedna's format: a JointInferenceService and a FederatedLearningJob")
	ji, err := d.applyJI()
	if err != nil {
		return err
	}
	job, err := d.applyFL()
	if err != nil {
		return err
	}
	if err := d.waitFor("the JointInferenceService to be Ready", func() bool {
		got := &v1alpha1.JointInferenceService{}
		return s.Client.Get(ctx, client.ObjectKeyFromObject(ji), got) == nil &&
			meta.IsStatusConditionTrue(got.Status.Conditions, jointinference.ConditionReady)
	}); err != nil {
		return err
	}
	d.kubectl("get", "ji,fl")
	d.kubectl("get", "pods", "-o", "wide")
	time.Sleep(2 * time.Second)
	say("The little model on edge3 sends its hard examples to the big model in the cloud: %d answered so far.", bigModelServed())

	step("2. Kill the little model's process on edge3 (as an out-of-memory kill would)")
	pod, err := d.edgeWorkerPod()
	if err != nil {
		return err
	}
	if err := s.KillWorker("edge3", "default", pod.Name, "little-model"); err != nil {
		return err
	}
	if err := d.waitFor("the node to restart it (its crash back-off is 10 s)", func() bool {
		p := &corev1.Pod{}
		return s.Client.Get(ctx, client.ObjectKeyFromObject(pod), p) == nil && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].RestartCount > 0 && p.Status.ContainerStatuses[0].State.Running != nil
	}); err != nil {
		return err
	}
	d.kubectl("get", "pod", pod.Name)

	step("3. Delete a federated learning trainer's pod: it comes back under the same name, same WORKER_NAME")
	trainer := fl.TrainerName(job.Name, 0)
	old := &corev1.Pod{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: trainer}, old); err != nil {
		return err
	}
	if err := s.Client.Delete(ctx, old); err != nil {
		return err
	}
	if err := d.waitFor("the trainer to be re-created", func() bool {
		p := &corev1.Pod{}
		return s.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: trainer}, p) == nil && p.UID != old.UID &&
			p.Status.Phase == corev1.PodRunning
	}); err != nil {
		return err
	}
	d.kubectl("get", "pod", trainer, "-o", `custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,WORKER_NAME:.spec.containers[0].env[?(@.name=="WORKER_NAME")].value,STATUS:.status.phase`)
	d.kubectl("get", "fl")

	step("4. Restart edge node edge3 (edgecore and its containers die): its worker comes back from the node's disk")
	if err := s.RestartNode("edge3"); err != nil {
		return err
	}
	before := bigModelServed()
	if err := d.waitFor("hard examples to flow again", func() bool { return bigModelServed() > before }); err != nil {
		return err
	}
	say("The big model has answered %d hard examples.", bigModelServed())

	step("5. Let the federated learning job finish its rounds")
	if err := d.waitFor("the job to complete", func() bool {
		got := &v1alpha1.FederatedLearningJob{}
		return s.Client.Get(ctx, client.ObjectKeyFromObject(job), got) == nil && got.Status.Phase == v1alpha1.FLJobSucceeded
	}); err != nil {
		return err
	}
	d.kubectl("get", "ji,fl")
	d.kubectl("get", "pods", "-o", "wide")

	step("6. Cut edge3 off from the API server (its agent still reaches the broker), then kill its worker")
	if err := d.cutOffKill(ji, pod); err != nil {
		return err
	}
	d.kubectl("get", "events", "--field-selector", "involvedObject.name="+ji.Name, "-o", "custom-columns=REASON:.reason,MESSAGE:.message")

	step("7. Cut edge3 off from everything, API server and broker; then edge3 loses its worker's pod (as an eviction would)")
	if err := d.cutOffLose(pod); err != nil {
		return err
	}
	if err := d.waitFor("the agent's journal to reach the cloud", func() bool {
		out, _ := s.Kubectl("get", "events", "--field-selector", "involvedObject.name="+ji.Name+",reason=RestartedOffline")
		return strings.Contains(out, "RestartedOffline")
	}); err != nil {
		return err
	}
	d.kubectl("get", "events", "--field-selector", "involvedObject.name="+ji.Name, "-o", "custom-columns=REASON:.reason,MESSAGE:.message")
	d.kubectl("get", "pods", "-o", "wide")

	if exitAfter {
		step("Done: stopping everything")
		return nil
	}
	step("Everything keeps running. Try it:")
	say("  export KUBECONFIG=%s", s.ControlPlane.Kubeconfig)
	say("  %s get ji,fl,pods -o wide", filepath.Join(s.ControlPlane.BinDir, "kubectl"))
	say("Logs of every process (control plane, controller, nodes): %s", s.ControlPlane.Dir)
	say("Stop with Ctrl-C or `make demo-down`.")
	<-d.ctx.Done()
	say("Stopping every process and removing %s ...", s.ControlPlane.Dir)
	return nil
}

// cutOffLose cuts edge3 off from the API server and the broker, makes it lose the little model's pod, narrates
// the agent rebuilding it as a static pod by its offline policy, then mends the links and shows the worker back
// in its own pod.
func (d *demo) cutOffLose(pod *corev1.Pod) error {
	s := d.s
	s.CutAPI("edge3")
	s.CutBroker("edge3")
	say("Nobody in the cloud can see edge3 now; its agent waits out its grace (2 s here) before acting alone.")
	time.Sleep(3 * time.Second)
	if err := s.LosePod("edge3", "default", pod.Name); err != nil {
		return err
	}
	lost := time.Now()
	if err := d.waitFor("the agent to rebuild the worker as a static pod", func() bool {
		return s.StandInRunning("edge3", "default", pod.Name, "little-model")
	}); err != nil {
		return err
	}
	say("Pod lost -> the worker runs again as a static pod (%s-edge3) in %v: the node would never have run it again by itself,\n"+
		"and the cloud cannot reach the node to do it.", pod.Name, time.Since(lost).Round(10*time.Millisecond))
	say("Mending the links.")
	s.RestoreBroker("edge3")
	s.RestoreAPI("edge3")
	return d.waitFor("the worker back in its own pod, the static pod gone", func() bool {
		return s.WorkerRunning("edge3", "default", pod.Name, "little-model") && !s.StandInRunning("edge3", "default", pod.Name, "little-model")
	})
}

// cutOffKill cuts edge3's link to the API server, kills the little model and narrates how it comes back, then
// mends the link.
func (d *demo) cutOffKill(ji *v1alpha1.JointInferenceService, pod *corev1.Pod) error {
	s := d.s
	s.CutAPI("edge3")
	defer s.RestoreAPI("edge3")
	if err := d.waitFor("the service's status to come from edge3's agent", func() bool {
		return d.edgeWorkerStatus(ji).Source == v1alpha1.StatusSourceAgent
	}); err != nil {
		return err
	}
	d.showEdgeWorker(ji)
	restarts := d.edgeWorkerStatus(ji).Restarts
	if err := s.KillWorker("edge3", "default", pod.Name, "little-model"); err != nil {
		return err
	}
	killed := time.Now()
	if err := d.waitFor("the status to show the worker dead, in the agent's word", func() bool {
		w := d.edgeWorkerStatus(ji)
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessDead
	}); err != nil {
		return err
	}
	d.showEdgeWorker(ji)
	if err := d.waitFor("the little model to run again", func() bool {
		return s.WorkerRunning("edge3", "default", pod.Name, "little-model")
	}); err != nil {
		return err
	}
	say("Killed -> running again in %v: edged restarts a crashed container after its crash back-off (10 s here, doubling at\n"+
		"each crash), which nothing can shorten, so Lifeline asks nothing of the node; what it adds while the node is cut off\n"+
		"is the truth in the cloud's status.", time.Since(killed).Round(10*time.Millisecond))
	if err := d.waitFor("the status to show it alive again, in the agent's word", func() bool {
		w := d.edgeWorkerStatus(ji)
		return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
	}); err != nil {
		return err
	}
	d.showEdgeWorker(ji)
	say("Mending the link.")
	s.RestoreAPI("edge3")
	if err := d.waitFor("the API server to be the truth again, with the restart counted", func() bool {
		w := d.edgeWorkerStatus(ji)
		return w.Source == v1alpha1.StatusSourceAPIServer && w.Liveness == v1alpha1.LivenessAlive && w.Restarts == restarts+1
	}); err != nil {
		return err
	}
	d.showEdgeWorker(ji)
	return nil
}

// edgeWorkerStatus is the service's status record of its edge worker.
func (d *demo) edgeWorkerStatus(ji *v1alpha1.JointInferenceService) v1alpha1.WorkerStatus {
	got := &v1alpha1.JointInferenceService{}
	if err := d.client.Get(d.ctx, client.ObjectKeyFromObject(ji), got); err == nil {
		for _, w := range got.Status.Workers {
			if w.Role == v1alpha1.WorkerRoleEdge {
				return w
			}
		}
	}
	return v1alpha1.WorkerStatus{}
}

func (d *demo) showEdgeWorker(ji *v1alpha1.JointInferenceService) {
	w := d.edgeWorkerStatus(ji)
	say("  status of the edge worker: liveness=%s phase=%s restarts=%d source=%s", w.Liveness, w.Phase, w.Restarts, w.Source)
}

func (d *demo) applyJI() (*v1alpha1.JointInferenceService, error) {
	var ji *v1alpha1.JointInferenceService
	err := d.applyExample("joint-inference.yaml", func(o client.Object) {
		if j, ok := o.(*v1alpha1.JointInferenceService); ok {
			ji = j
		}
	})
	if err == nil && ji == nil {
		err = fmt.Errorf("deploy/examples/joint-inference.yaml holds no JointInferenceService")
	}
	return ji, err
}

func (d *demo) applyFL() (*v1alpha1.FederatedLearningJob, error) {
	var job *v1alpha1.FederatedLearningJob
	err := d.applyExample("federated-learning.yaml", func(o client.Object) {
		j, ok := o.(*v1alpha1.FederatedLearningJob)
		if !ok {
			return
		}
		job = j
		// Enough rounds to watch the job train while the story goes on.
		agg := &j.Spec.AggregationWorker.Template.Spec.Containers[0]
		rounds := "its default"
		for _, e := range agg.Env {
			if e.Name == "exit_round" {
				rounds = e.Value
			}
		}
		agg.Env = []corev1.EnvVar{{Name: "exit_round", Value: "60"}}
		say("  (the demo raises the job's exit_round from %s to 60 so it is still training during the next steps)", rounds)
	})
	if err == nil && job == nil {
		err = fmt.Errorf("deploy/examples/federated-learning.yaml holds no FederatedLearningJob")
	}
	return job, err
}

// applyExample creates every object of one of Lifeline's examples in the default namespace, as
// `envsubst < deploy/examples/<file> | kubectl apply -f -` would; edit sees each object before it is created.
func (d *demo) applyExample(file string, edit func(client.Object)) error {
	objs, err := testkit.Objects(file, d.vars)
	if err != nil {
		return err
	}
	say("  applying deploy/examples/%s:", file)
	for _, obj := range objs {
		obj.SetNamespace("default")
		edit(obj)
		kind := obj.GetObjectKind().GroupVersionKind().Kind // the client's decoding of the answer clears it
		if err := d.create(obj); err != nil {
			return err
		}
		say("    %s %s", kind, obj.GetName())
	}
	return nil
}

func (d *demo) create(obj client.Object) error {
	if err := d.client.Create(d.ctx, obj); err != nil {
		return fmt.Errorf("creating %s: %w", obj.GetName(), err)
	}
	return nil
}

func (d *demo) edgeWorkerPod() (*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := d.client.List(d.ctx, pods, client.InNamespace("default"), client.MatchingLabels{"lifeline.sedna.io/role": "edge"}); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no edge worker pod")
}

// waitFor polls cond, printing a dot a second, for up to d.patience.
func (d *demo) waitFor(what string, cond func() bool) error {
	fmt.Printf("  waiting for %s ", what)
	began := time.Now()
	lastDot := began
	for time.Since(began) < d.patience {
		if cond() {
			fmt.Printf(" done (%.1fs)\n", time.Since(began).Seconds())
			return nil
		}
		if time.Since(lastDot) >= time.Second {
			fmt.Print(".")
			lastDot = time.Now()
		}
		select {
		case <-d.ctx.Done():
			return d.ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Println()
	return fmt.Errorf("timed out waiting for %s", what)
}

func (d *demo) kubectl(args ...string) {
	fmt.Printf("\n$ kubectl %s\n", strings.Join(args, " "))
	out, err := d.runKubectl(args...)
	fmt.Print(out)
	if err != nil {
		fmt.Println("  (kubectl:", err, ")")
	}
}

func bigModelServed() int {
	resp, err := http.Get("http://127.0.0.1:5000/stats")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var stats struct {
		Served int `json:"served"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&stats)
	return stats.Served
}

func step(title string) { fmt.Printf("\n==> %s\n", title) }

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }
