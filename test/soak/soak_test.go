package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var (
	edges = []string{"edge1", "edge2"} // where the FL job's trainers run: the faults go there
	nodes = []string{"cloud", "edge1", "edge2", "edge3"}
)

// soak is one run's state and its counts.
type soak struct {
	t        *testing.T
	s        *harness.Sim
	rng      *rand.Rand
	cutAPI   map[string]bool
	cutMQTT  map[string]bool
	job      *v1alpha1.FederatedLearningJob // the job running now, nil between jobs
	jobs     int
	ended    []*v1alpha1.FederatedLearningJob // jobs that ended, to check their reports
	deleted  map[string]deletedJob            // by name: jobs deleted, until their workers are gone
	twice    map[string]bool                  // identities seen running twice at the previous check
	counted  map[string]bool                  // identities already counted as duplicates
	cycles   int
	dups     int
	lost     int
	orphans  int
	unended  int
	lastStep string
	ji       *jiChurn
}

func TestSoak(t *testing.T) {
	harness.SkipIfShort(t)
	cycles := 20
	if v := os.Getenv("SOAK_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SOAK_CYCLES=%q: %v", v, err)
		}
		cycles = n
	}
	// The short run of every test run replays one known seed, so it is the same run each time; make soak draws a
	// new seed each time (SOAK_SEED=random).
	seed := uint64(42)
	if v := os.Getenv("SOAK_SEED"); v == "random" {
		seed = uint64(time.Now().UnixNano())
	} else if v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", v, err)
		}
		seed = n
	}
	fmt.Printf("soak: SOAK_SEED=%d, %d cycles\n", seed, cycles)
	log.SetLogger(logr.Discard())
	// The daemons run under the chart's memory limits: a fault that makes one outgrow it kills it here too.
	s, err := harness.StartSim(context.Background(), harness.SimOptions{CrashBackoff: 2 * time.Second,
		Cluster:          harness.ControlPlaneOptions{NodeMonitorGracePeriod: 20 * time.Second},
		AgentMemoryLimit: agentMemoryLimit, ControllerMemoryLimit: controllerMemoryLimit})
	if err != nil {
		t.Fatalf("starting the simulation: %v", err)
	}
	defer func() {
		if t.Failed() {
			s.ControlPlane.KeepDir()
			t.Logf("simulation logs kept in %s; replay with SOAK_SEED=%d", s.ControlPlane.Dir, seed)
		}
		s.Stop()
	}()
	k := &soak{t: t, s: s, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), cutAPI: map[string]bool{}, cutMQTT: map[string]bool{},
		deleted: map[string]deletedJob{}, twice: map[string]bool{}, counted: map[string]bool{}}
	k.inputs()
	k.ji = newJIChurn(k, seed)
	for k.cycles = 1; k.cycles <= cycles; k.cycles++ {
		k.step()
		k.ji.step()
		// The system's reaction: what the cycle checks is what holds after it. A fixed time by design, no event to
		// wait for: a cycle's fault has no one outcome (a kill on a cut-off node may be healed, restarted by the node
		// or left to the job's budget, and many faults are followed by nothing), and a duplicate counts only when
		// seen at two checks in a row, this far apart, so that a hand-over's overlap of a moment is not one.
		time.Sleep(1500 * time.Millisecond)
		running := k.check(false)
		k.ji.check()
		t.Logf("cycle %d: %s; JI: %s; %d FL worker processes running", k.cycles, k.lastStep, k.ji.lastStep, running)
	}
	k.finish()
	k.ji.finish()
	succeeded := 0
	for _, j := range k.ended {
		if j.Status.Phase == v1alpha1.FLJobSucceeded {
			succeeded++
		}
	}
	fmt.Printf("soak: seed=%d cycles=%d jobs=%d succeeded=%d failed=%d deleted=%d duplicates=%d lost-reports=%d orphans=%d unended-jobs=%d "+
		"ji-services=%d ji-orphans=%d ji-down=%d\n", seed, cycles, k.jobs, succeeded, len(k.ended)-succeeded, k.jobs-len(k.ended)-k.unended,
		k.dups, k.lost, k.orphans, k.unended, k.ji.created, k.ji.orphans, k.ji.down)
	k.checkMemory()
	if k.dups+k.lost+k.orphans+k.unended > 0 {
		t.Errorf("promises broken (seed %d): duplicates %d, lost reports %d, orphans %d, jobs that never ended %d",
			seed, k.dups, k.lost, k.orphans, k.unended)
	}
}

// The chart's memory limits (deploy/chart/lifeline/values.yaml).
const (
	agentMemoryLimit      = 64 << 20
	controllerMemoryLimit = 256 << 20
)

// checkMemory fails the run if the kernel killed a daemon for outgrowing its limit, and prints each one's peak.
func (k *soak) checkMemory() {
	use, err := k.s.MemoryUse()
	if err != nil {
		k.t.Errorf("reading the daemons' memory: %v", err)
		return
	}
	if len(use) == 0 {
		fmt.Println("soak: memory limits not enforced (no memory cgroup here)")
		return
	}
	var names []string
	for name := range use {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		u := use[name]
		fmt.Printf("soak: %s peak %.1f MiB, OOM kills %d\n", name, float64(u.PeakBytes)/(1<<20), u.OOMKills)
		if u.OOMKills > 0 {
			k.t.Errorf("%s was killed %d times for outgrowing its memory limit", name, u.OOMKills)
		}
	}
}

// inputs creates the Model and Datasets the FL fixture names.
func (k *soak) inputs() {
	ctx := context.Background()
	if err := k.s.Client.Create(ctx, &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "surface-defect-detection-model"},
		Spec: v1alpha1.ModelSpec{URL: "/tmp/lifeline-models/surface-defect-detection-model.pb", Format: "pb"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		k.t.Fatal(err)
	}
	for name, node := range map[string]string{"edge1-surface-defect-detection-dataset": "edge1", "edge2-surface-defect-detection-dataset": "edge2"} {
		if err := k.s.Client.Create(ctx, &v1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.DatasetSpec{URL: "/tmp/lifeline-data/" + name + "/train.txt", Format: "txt", NodeName: node}}); err != nil && !apierrors.IsAlreadyExists(err) {
			k.t.Fatal(err)
		}
	}
}

// startJob creates the next FL job, once no deleted job's worker runs any more (workers of two jobs would
// collide on their ports: the simulated nodes share this machine's network).
func (k *soak) startJob() {
	if k.job != nil || len(k.deleted) > 0 {
		return
	}
	job := &v1alpha1.FederatedLearningJob{}
	if err := testkit.LoadObject("federated-learning.yaml", harness.FixtureVars, job); err != nil {
		k.t.Fatal(err)
	}
	k.jobs++
	job.Namespace, job.Name = "default", fmt.Sprintf("soak-%d", k.jobs)
	if err := k.s.Client.Create(context.Background(), job); err != nil {
		k.t.Fatalf("creating %s: %v", job.Name, err)
	}
	k.job = job
}

// step does one seeded thing to the world.
func (k *soak) step() {
	k.startJob()
	node := edges[k.rng.IntN(len(edges))]
	var err error
	switch n := k.rng.IntN(100); {
	case n < 15:
		if k.cutAPI[node] {
			k.lastStep = "restore api " + node
			k.s.RestoreAPI(node)
		} else {
			k.lastStep = "cut api " + node
			k.s.CutAPI(node)
		}
		k.cutAPI[node] = !k.cutAPI[node]
	case n < 30:
		if k.cutMQTT[node] {
			k.lastStep = "restore broker " + node
			k.s.RestoreBroker(node)
		} else {
			k.lastStep = "cut broker " + node
			k.s.CutBroker(node)
		}
		k.cutMQTT[node] = !k.cutMQTT[node]
	case n < 50:
		pod, container, ok := k.runningWorker(node)
		if !ok {
			k.lastStep = "nothing to kill on " + node
			return
		}
		k.lastStep = "kill " + pod + " on " + node
		err = k.s.KillWorker(node, "default", pod, container)
	case n < 58:
		pod, _, ok := k.runningWorker(node)
		if !ok {
			k.lastStep = "nothing to lose on " + node
			return
		}
		k.lastStep = "lose " + pod + " on " + node
		err = k.s.LosePod(node, "default", pod)
	case n < 66:
		k.lastStep = "restart agent " + node
		k.s.StopAgent(node)
		err = k.s.StartAgent(node)
	case n < 72:
		k.lastStep = "reboot " + node
		err = k.s.RestartNode(node)
	case n < 78:
		k.lastStep = "restart controller and broker"
		err = k.s.RestartController()
	case n < 84:
		pods := k.jobPods(k.job)
		if len(pods) == 0 {
			k.lastStep = "no worker pod to delete"
			return
		}
		p := pods[k.rng.IntN(len(pods))]
		k.lastStep = "delete pod " + p.Name
		err = client.IgnoreNotFound(k.s.Client.Delete(context.Background(), &p))
	case n < 90:
		if k.job == nil {
			k.lastStep = "no job to edit"
			return
		}
		// The run policy is what stays editable on a running job.
		limit, backoff := 4+k.rng.IntN(12), 1+k.rng.IntN(3)
		k.lastStep = fmt.Sprintf("edit %s: backoffLimit %d, backoffSeconds %d", k.job.Name, limit, backoff)
		patch := fmt.Sprintf(`{"spec":{"runPolicy":{"backoffLimit":%d,"backoffSeconds":%d}}}`, limit, backoff)
		err = client.IgnoreNotFound(k.s.Client.Patch(context.Background(), k.job.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))))
	default:
		if k.job == nil {
			k.lastStep = "no job to delete"
			return
		}
		k.lastStep = "delete job " + k.job.Name
		workers := map[string][]string{}
		for _, p := range k.jobPods(k.job) {
			workers[p.Name] = containerNames(&p)
		}
		k.deleted[k.job.Name] = deletedJob{at: time.Now(), workers: workers}
		err = client.IgnoreNotFound(k.s.Client.Delete(context.Background(), k.job))
		k.job = nil
	}
	if err != nil {
		k.t.Logf("cycle %d (%s): %v", k.cycles, k.lastStep, err)
	}
}

// runningWorker picks a worker process running on node: of the job's pods, or one rebuilt as a static pod.
func (k *soak) runningWorker(node string) (pod, container string, ok bool) {
	var found [][2]string
	for _, p := range k.jobPods(k.job) {
		for _, name := range []string{p.Name, p.Name + "-" + node} {
			for _, c := range containerNames(&p) {
				if k.s.WorkerRunning(node, "default", name, c) {
					found = append(found, [2]string{name, c})
				}
			}
		}
	}
	if len(found) == 0 {
		return "", "", false
	}
	f := found[k.rng.IntN(len(found))]
	return f[0], f[1], true
}

func (k *soak) jobPods(job *v1alpha1.FederatedLearningJob) []corev1.Pod {
	if job == nil {
		return nil
	}
	list := &corev1.PodList{}
	if err := k.s.Client.List(context.Background(), list, client.InNamespace("default"),
		client.MatchingLabels{jobLabel: job.Name}); err != nil {
		k.t.Logf("listing %s's pods: %v", job.Name, err)
		return nil
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func containerNames(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

// observe lists the workers' pods on the API server (of every job) and probes, on every node, the processes
// of the given identities: their own pods' and those of static pods standing in for them.
func (k *soak) observe(identities map[string][]string) ([]corev1.Pod, map[process]bool) {
	list := &corev1.PodList{}
	if err := k.s.Client.List(context.Background(), list, client.InNamespace("default"), client.HasLabels{jobLabel}); err != nil {
		k.t.Logf("listing the workers' pods: %v", err)
	}
	running := map[process]bool{}
	for name, cs := range identities {
		for _, node := range nodes {
			for _, pod := range []string{name, name + "-" + node} {
				for _, c := range cs {
					if k.s.WorkerRunning(node, "default", pod, c) {
						running[process{node, pod, c}] = true
					}
				}
			}
		}
	}
	return list.Items, running
}

// check counts what the cycle broke, and says how many worker processes run. final waits out what a settled
// system must reach.
func (k *soak) check(final bool) int {
	ctx := context.Background()
	identities := map[string][]string{}
	for _, p := range k.jobPods(k.job) {
		identities[p.Name] = containerNames(&p)
	}
	for _, d := range k.deleted {
		for name, cs := range d.workers {
			identities[name] = cs
		}
	}
	pods, running := k.observe(identities)
	count := 0
	for name, cs := range identities {
		count += instances(running, nodes, name, cs)
	}
	twice, dups := duplicates(identities, running, nodes, k.twice, k.counted)
	k.twice = twice
	for _, v := range dups {
		k.counted[v.subject] = true
		k.dups++
		k.t.Errorf("cycle %d (after %s): %v", k.cycles, k.lastStep, v)
	}
	// A deleted job's workers must all stop, once the nodes can hear of it.
	gone, orphaned := orphans(k.deleted, pods, running, nodes, time.Now(), !anyTrue(k.cutAPI), final)
	for _, name := range gone {
		delete(k.deleted, name)
	}
	for _, v := range orphaned {
		k.orphans++
		k.t.Errorf("cycle %d: %v", k.cycles, v)
		delete(k.deleted, v.subject)
	}
	if k.job != nil {
		got := &v1alpha1.FederatedLearningJob{}
		if err := k.s.Client.Get(ctx, client.ObjectKeyFromObject(k.job), got); err == nil && ended(got) {
			k.ended = append(k.ended, got)
			k.job = nil
		}
	}
	return count
}

func anyTrue(m map[string]bool) bool {
	for _, v := range m {
		if v {
			return true
		}
	}
	return false
}

// finish mends every link, lets the running job end and the deleted ones' workers stop, and checks that every
// succeeded job has its trainers' reports to the last round.
func (k *soak) finish() {
	for _, node := range edges {
		k.s.RestoreAPI(node)
		k.s.RestoreBroker(node)
		k.cutAPI[node], k.cutMQTT[node] = false, false
	}
	k.lastStep = "every link mended"
	if k.job != nil || len(k.deleted) > 0 {
		// Checked every second, about as often as the cycles checked: what a check counts stays counted.
		poll(time.Second, 3*time.Minute, false, func() bool {
			_ = k.check(false)
			return k.job == nil && len(k.deleted) == 0
		})
	}
	if k.job != nil {
		last := k.job // what was created, if the API server no longer has it
		got := &v1alpha1.FederatedLearningJob{}
		if err := k.s.Client.Get(context.Background(), client.ObjectKeyFromObject(k.job), got); err == nil {
			last = got
		}
		for _, v := range unendedJobs(last) {
			k.unended++
			k.t.Errorf("%v within 3 minutes of every link mended", v)
		}
	}
	_ = k.check(true)
	for _, j := range k.ended {
		if j.Status.Phase != v1alpha1.FLJobSucceeded {
			continue
		}
		// The last reports may reach the status after the phase: give them the time to.
		lost := lostReports(j)
		if len(lost) > 0 {
			poll(500*time.Millisecond, 30*time.Second, true, func() bool {
				got := &v1alpha1.FederatedLearningJob{}
				if err := k.s.Client.Get(context.Background(), client.ObjectKeyFromObject(j), got); err != nil {
					return true // gone: what it showed last is what it had
				}
				lost = lostReports(got)
				return len(lost) == 0
			})
		}
		for _, v := range lost {
			k.lost++
			k.t.Errorf("%v", v)
		}
	}
}

// poll asks cond every interval (first at once when immediate) until it holds or within has passed, and tells
// whether it came to hold. Unlike testkit's waits it does not end the test: the soak counts what never came to
// hold as a broken promise, and goes on checking the others and printing its summary.
func poll(interval, within time.Duration, immediate bool, cond func() bool) bool {
	return wait.PollUntilContextTimeout(context.Background(), interval, within, immediate, func(context.Context) (bool, error) {
		return cond(), nil
	}) == nil
}
