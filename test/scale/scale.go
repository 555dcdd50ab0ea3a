// Package scale measures Lifeline at the size of a fleet: a real control plane, kwok playing hundreds of edge
// nodes, the controller as its own process (bin/lifeline-controller), and one simulated agent per node speaking
// the liveness protocol to the controller's embedded broker through the agent's own publisher. Every figure is
// printed beside an anchor measured in the same run (docs/performance.md).
package scale

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// Namespaces: Lifeline's workloads, and the anchor's copies of their children.
const (
	Namespace    = "scale"
	RawNamespace = "scale-raw"
	mqttCluster  = "scale"
)

// Config sizes a run.
type Config struct {
	// Nodes is the number of edge nodes, each with its agent; there are as many JointInferenceServices and
	// FederatedLearningJobs (one aggregator and TrainersPerJob trainers each).
	Nodes int
	// CloudNodes hold the cloud workers and aggregators (default 3).
	CloudNodes int
	// DetectSamples is how many worker deaths the detection latency is measured on (default min(20, Nodes/2)).
	DetectSamples int
	// CutOff is how many nodes are cut off at once (default min(100, Nodes/2)).
	CutOff int
	// Recreations is how many times the JI's edge Deployment and the anchor's ReplicaSet are deleted (default 20).
	Recreations int
	// Parallelism is how many requests the harness has in flight when it creates objects, for Lifeline's
	// workloads and the anchor's children alike (default 16).
	Parallelism int
	// NodeGrace is the node lifecycle controller's grace before it marks a silent node not Ready, and the
	// duration of the Leases kwok renews (default 40 s, as upstream).
	NodeGrace time.Duration
	// SteadyWindow is how long controller CPU is measured with every agent heartbeating (default 20 s).
	SteadyWindow time.Duration
	// ProfileDir, when set, receives the controller's heap profile at the end of the run (heap-<nodes>.pprof, and
	// as text heap-<nodes>.txt), its CPU profiles of the steady windows (cpu-heartbeats-<nodes>.pprof,
	// cpu-reports-<nodes>.pprof), and its, the API server's and the harness's of the outage and its heal
	// and their anchors' (cpu-{outage,heal,outage-anchor,heal-anchor}-{controller,apiserver,harness}-<nodes>.pprof),
	// with what the controller allocated meanwhile (allocs-<step>-controller-<nodes>.pprof).
	ProfileDir string
	// ControllerArgs are more flags for the controller, e.g. --concurrent-reconciles.
	ControllerArgs []string
	// MemoryLimit is the container memory limit the controller is run as if under, in bytes: it gets the soft
	// limit it sets itself inside such a container (--memory-limit-fraction, 90 %) through GOMEMLIMIT. Default:
	// the chart's limit, 256 MiB; negative: none.
	MemoryLimit int64
	// Progress receives one line per step (default: discarded).
	Progress io.Writer
	// DisarmStandIns runs the fleet as the chart with agent.armStandIns=false: no agent arms a stand-in, so no
	// node makes its mirror pod. By default every edge worker has one, as with the chart's defaults.
	DisarmStandIns bool
	// CutOffsOnly measures only the mass cut-off, the outage, its heal and their anchors once the workloads have
	// settled: no children's anchor, no steady windows, no detection, re-creation or restart (a third of a full
	// run's time at 1,000 nodes).
	CutOffsOnly bool
	// ChildrenOnly measures only the workloads' children and their anchor, then stops.
	ChildrenOnly bool
}

func (c *Config) defaults() {
	if c.CloudNodes == 0 {
		c.CloudNodes = 3
	}
	if c.DetectSamples == 0 {
		c.DetectSamples = min(20, max(c.Nodes/2, 1))
	}
	if c.CutOff == 0 {
		c.CutOff = min(100, max(c.Nodes/2, 1))
	}
	if c.Recreations == 0 {
		c.Recreations = 20
	}
	if c.Parallelism == 0 {
		c.Parallelism = 16
	}
	if c.NodeGrace == 0 {
		c.NodeGrace = 40 * time.Second
	}
	if c.SteadyWindow == 0 {
		c.SteadyWindow = 20 * time.Second
	}
	if c.MemoryLimit == 0 {
		c.MemoryLimit = ChartMemoryLimit
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// ChartMemoryLimit is the controller's memory limit in the chart's values (deploy/chart/lifeline).
const ChartMemoryLimit = 256 << 20

// controllerEnv is the harness's environment with the soft memory limit the controller would set itself under
// cfg.MemoryLimit; the harness's process has no such limit of its own to read.
func (h *scaleRun) controllerEnv() []string {
	env := os.Environ()
	if h.cfg.MemoryLimit > 0 {
		env = append(env, fmt.Sprintf("GOMEMLIMIT=%d", int64(float64(h.cfg.MemoryLimit)*0.9)))
	}
	return env
}

// Result is what a run measured.
type Result struct {
	Nodes, Workers, Children int
	// ChildrenLifeline is from the first workload's creation until every child of every workload exists;
	// ChildrenRaw the same for a client creating those children itself.
	ChildrenLifeline, ChildrenRaw time.Duration
	// StatusSettled is from the first creation until every worker's status is Alive.
	StatusSettled time.Duration
	// Reconciles, ReconcileP50 and ReconcileP99 (seconds) are by controller, from the creation until the statuses settled.
	Reconciles                 map[string]float64
	ReconcileP50, ReconcileP99 map[string]float64
	// ControllerCores is the controller's CPU while the workloads were created and settled; IngestionCores while
	// nothing happened but every agent's heartbeats, at MessagesPerSecond.
	ControllerCores, IngestionCores, MessagesPerSecond float64
	// ReportingCores is the controller's CPU while the JI edge workers also report, at ReportingMessagesPerSecond,
	// ReportsPerSecond of them reports.
	ReportingCores, ReportingMessagesPerSecond, ReportsPerSecond float64
	// ControllerRSS is the controller's resident set at the end, ControllerPeakRSS its peak (bytes).
	ControllerRSS, ControllerPeakRSS int64
	// Detect holds, per worker death on a cut-off node, the time from the agent's state until the status showed
	// it, once the controller's queues were empty; DetectBehindReports the same right after the reporting window.
	Detect, DetectBehindReports []time.Duration
	// MassCutoff is from cutting CutOff nodes off at once until every status of their workers is in the agents'
	// word; CutOffWorkers counts those workers; NodesUnknown is until the node lifecycle controller marked every
	// one of them not Ready, after which the statuses were checked again.
	MassCutoff, NodesUnknown time.Duration
	CutOffWorkers            int
	// OutageAll is from cutting every edge node off at once until every worker status is in its agent's word;
	// OutageHeal from mending them all, once the nodes were marked not Ready, until every status is in the API
	// server's word again.
	OutageAll, OutageHeal time.Duration
	// OutageRaw is the outage's anchor: a client that does nothing else writing the statuses the outage writes;
	// HealRaw the heal's: the same client writing them back while kwok takes the nodes back.
	OutageRaw, HealRaw time.Duration
	// RecreateJI and RecreateRS are the child re-creation samples: the JI's edge Deployment, and the anchor
	// Deployment's ReplicaSet.
	RecreateJI, RecreateRS []time.Duration
	// StandInsArmed counts the stand-ins' mirror pods the nodes made (none when arming is off); Armed is from the
	// first workload's creation until the last of them was made. APIServerRSS and EtcdRSS are their resident sets
	// once every status settled and every stand-in was armed (bytes).
	StandInsArmed         int
	Armed                 time.Duration
	APIServerRSS, EtcdRSS int64
	// RestartReconnect is from a controller's restart until every agent is connected again;
	// RestartPeakAttempts the fleet's most session attempts in one second meanwhile.
	RestartReconnect    time.Duration
	RestartPeakAttempts float64
}

// scaleRun holds a run's processes and clients.
type scaleRun struct {
	t          testing.TB
	cfg        Config
	cp         *harness.ControlPlane
	kube       kubernetes.Interface
	c          client.Client
	cache      cache.Cache
	fleet      *fleet
	armer      *standInArmer // nil when stand-ins are not armed
	controller *harness.Process
	// controllerLaunch starts the controller as the run started it, under name.
	controllerLaunch func(name string) (*harness.Process, error)
	metricsURL       string
	pprofURL         string
	seen             *seenObjects
	progress         func(format string, args ...any)
}

// Run starts everything, measures, and stops everything. It fails t on any error.
func Run(t testing.TB, cfg Config) *Result {
	t.Helper()
	cfg.defaults()
	ctrllog.SetLogger(logr.Discard()) // the harness's cache; the controller logs to its own file
	began := time.Now()
	h := &scaleRun{t: t, cfg: cfg, seen: newSeenObjects()}
	h.progress = func(format string, args ...any) {
		fmt.Fprintf(cfg.Progress, "scale %d: "+format+" (%.0fs)\n", append([]any{cfg.Nodes}, append(args, time.Since(began).Seconds())...)...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.start(ctx)
	r := &Result{Nodes: cfg.Nodes, Workers: cfg.Nodes * (2 + 1 + TrainersPerJob)}
	defer func() {
		if t.Failed() { // what was measured before the failure is still worth reading
			for _, line := range r.Lines() {
				fmt.Fprintln(cfg.Progress, "measured before the failure: "+line)
			}
		}
	}()
	h.measureCreation(ctx, r)
	if cfg.CutOffsOnly {
		h.waitQuiet()
		h.measureMassCutoff(ctx, r)
		h.measureOutage(ctx, r)
		h.measureOutageAnchor(ctx, r)
		end, err := sampleProc(h.controller.Pid())
		h.check(err)
		r.ControllerRSS, r.ControllerPeakRSS = end.rss, end.hwm
		return r
	}
	h.measureRaw(ctx, r)
	if cfg.ChildrenOnly {
		return r
	}
	h.waitDeploymentControllerIdle() // the windows below measure Lifeline, not the backlog the anchor left
	h.measureSteady(r)
	// Right after the reporting window, the passes its reports called for are still queued: a death waits for a
	// worker to come free of them.
	r.DetectBehindReports = h.measureDetection(ctx, "detection behind the reports' passes")
	h.waitQueuesDrained()
	r.Detect = h.measureDetection(ctx, "detection")
	h.waitQuiet()
	h.measureMassCutoff(ctx, r)
	h.measureOutage(ctx, r)
	h.measureOutageAnchor(ctx, r)
	h.measureRecreation(r)
	end, err := sampleProc(h.controller.Pid())
	h.check(err)
	if cfg.ProfileDir != "" {
		h.check(h.saveProfile("heap", filepath.Join(cfg.ProfileDir, fmt.Sprintf("heap-%d.pprof", cfg.Nodes))))
		// The text form ends with the runtime's memory statistics: stacks and the collector's figures.
		h.check(h.saveProfile("heap?debug=1", filepath.Join(cfg.ProfileDir, fmt.Sprintf("heap-%d.txt", cfg.Nodes))))
	}
	r.ControllerRSS, r.ControllerPeakRSS = end.rss, end.hwm
	h.measureRestartReconnect(r)
	if err := h.cp.Healthy(); err != nil {
		t.Fatal(err)
	}
	if err := h.controller.Exited(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (h *scaleRun) check(err error) {
	h.t.Helper()
	if err != nil {
		h.cp.KeepDir()
		h.t.Fatalf("%v (logs kept in %s)", err, h.cp.Dir)
	}
}

// start brings up the control plane, kwok and its nodes, the controller, the harness's cache and the agents.
func (h *scaleRun) start(ctx context.Context) {
	root, err := testkit.RepoRoot()
	if err != nil {
		h.t.Fatal(err)
	}
	h.cp, err = harness.StartControlPlane(ctx, harness.ControlPlaneOptions{WithoutScheduler: true, Progress: h.cfg.Progress,
		CRDDirs: []string{filepath.Join(root, "deploy", "crds")}, Policies: []string{filepath.Join(root, "deploy", "manifests", "lifeline.yaml")},
		NodeMonitorGracePeriod: h.cfg.NodeGrace, APIServerArgs: []string{quietAPIServer}})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(h.cp.Stop)
	cfg := rest.CopyConfig(h.cp.Config)
	cfg.QPS = -1 // the anchor and the workloads are created as fast as the API server takes them
	h.kube, err = kubernetes.NewForConfig(cfg)
	h.check(err)
	scheme, err := manager.Scheme()
	h.check(err)
	h.c, err = client.New(cfg, client.Options{Scheme: scheme})
	h.check(err)

	_, err = startKwok(h.cp, h.cfg.NodeGrace)
	h.check(err)
	var nodes []*corev1.Node
	var edge []string
	for i := 0; i < h.cfg.CloudNodes; i++ {
		nodes = append(nodes, newNode(CloudNodeName(i), false))
	}
	for i := 0; i < h.cfg.Nodes; i++ {
		nodes = append(nodes, newNode(EdgeNodeName(i), true))
		edge = append(edge, EdgeNodeName(i))
	}
	h.check(h.createAll(ctx, len(nodes), func(i int) client.Object { return nodes[i] }))
	h.waitFor(3*time.Minute, "every node Ready", func() (bool, error) {
		list, err := h.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range list.Items {
			if nodeReady(&n) == corev1.ConditionTrue {
				ready++
			}
		}
		return ready == len(nodes), fmt.Errorf("%d of %d nodes Ready", ready, len(nodes))
	})
	h.progress("%d nodes Ready under kwok", len(nodes))
	if !h.cfg.DisarmStandIns {
		edgeNodes := map[string]types.UID{}
		list, err := h.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: broker.EdgeNodeLabel})
		h.check(err)
		for _, n := range list.Items {
			edgeNodes[n.Name] = n.UID
		}
		h.armer = newStandInArmer(ctx, h.kube, edgeNodes)
		h.t.Cleanup(h.armer.stop)
	}

	credentials := filepath.Join(h.cp.Dir, "mqtt-credentials")
	h.check(writeCredentials(credentials, edge))
	mqttAddr, metricsAddr, pprofAddr := harness.FreeAddr(h.t), harness.FreeAddr(h.t), harness.FreeAddr(h.t)
	h.metricsURL, h.pprofURL = "http://"+metricsAddr+"/metrics", "http://"+pprofAddr+"/debug/pprof/"
	binary, err := controllerBinary(root)
	h.check(err)
	args := append([]string{
		"--kubeconfig=" + h.cp.Kubeconfig, "--metrics-bind-address=" + metricsAddr, "--health-probe-bind-address=0",
		"--pprof-bind-address=" + pprofAddr,
		"--mqtt-address=" + mqttAddr, "--mqtt-credentials-dir=" + credentials, "--cluster=" + mqttCluster,
		// Every agent holds a connection, and the harness's own are few: the default of 1000 is too few at 1000 nodes.
		"--mqtt-max-connections=" + strconv.Itoa(h.cfg.Nodes+100),
	}, h.cfg.ControllerArgs...)
	h.controllerLaunch = func(name string) (*harness.Process, error) {
		return h.cp.Launch(name, binary, args, h.controllerEnv())
	}
	h.controller, err = h.controllerLaunch("lifeline-controller")
	h.check(err)
	h.waitFor(time.Minute, "the controller's metrics endpoint", func() (bool, error) {
		_, err := scrapeHistograms(h.metricsURL, "controller_runtime_reconcile_time_seconds", "controller")
		return err == nil, err
	})
	h.progress("lifeline-controller started (pid %d, log %s)", h.controller.Pid(), h.controller.LogPath())

	h.cache, err = cache.New(cfg, cache.Options{Scheme: scheme,
		DefaultNamespaces: map[string]cache.Config{Namespace: {}, RawNamespace: {}}})
	h.check(err)
	for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &corev1.Pod{},
		&v1alpha1.JointInferenceService{}, &v1alpha1.FederatedLearningJob{}} {
		inf, err := h.cache.GetInformer(ctx, obj)
		h.check(err)
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { h.observed(o) },
			UpdateFunc: func(_, o any) { h.observed(o) },
			DeleteFunc: h.deleted,
		})
		h.check(err)
	}
	go func() { _ = h.cache.Start(ctx) }()
	if !h.cache.WaitForCacheSync(ctx) {
		h.check(fmt.Errorf("the harness's cache did not sync"))
	}

	h.fleet, err = startFleet(ctx, mqttAddr, mqttCluster, credentials, filepath.Join(h.cp.Dir, "agents"), edge, logr.Discard())
	h.check(err)
	h.t.Cleanup(h.fleet.Stop)
	h.waitFor(3*time.Minute, "every agent connected", func() (bool, error) {
		n := h.fleet.connected()
		return n == len(edge), fmt.Errorf("%d of %d agents connected", n, len(edge))
	})
	h.progress("%d agents connected, heartbeating every %v", len(edge), HeartbeatInterval)
}

// observed records when a child first appeared, and lets the pod's agent see a running pod.
func (h *scaleRun) observed(o any) {
	obj, ok := o.(client.Object)
	if !ok {
		return
	}
	switch pod := obj.(type) {
	case *appsv1.Deployment, *corev1.Service:
		h.seen.add(obj)
	case *corev1.Pod:
		if metav1.GetControllerOf(pod) != nil && metav1.GetControllerOf(pod).Kind == "FederatedLearningJob" ||
			pod.Namespace == RawNamespace && pod.Labels[rawPodLabel] != "" {
			h.seen.add(obj)
		}
		if h.fleet != nil {
			h.fleet.observe(pod)
		}
		if h.armer != nil && pod.Namespace == Namespace {
			h.armer.observe(pod, false)
		}
	}
}

// deleted lets a deleted worker pod's node remove its stand-in.
func (h *scaleRun) deleted(o any) {
	if tombstone, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = tombstone.Obj
	}
	if pod, ok := o.(*corev1.Pod); ok && h.armer != nil && pod.Namespace == Namespace {
		h.armer.observe(pod, true)
	}
}

// saveProfile writes one of the controller's pprof profiles to path; name may carry a query.
func (h *scaleRun) saveProfile(name, path string) error {
	resp, err := http.Get(h.pprofURL + name)
	if err != nil {
		return fmt.Errorf("reading the controller's %s profile: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reading the controller's %s profile: %s", name, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("saving the controller's %s profile: %w", name, err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("saving the controller's %s profile: %w", name, err)
	}
	h.progress("controller profile %s", path)
	return f.Close()
}

// measureCreation creates the workloads and times their children and their statuses.
func (h *scaleRun) measureCreation(ctx context.Context, r *Result) {
	n := h.cfg.Nodes
	h.check(h.createAll(ctx, 2, func(i int) client.Object {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: []string{Namespace, RawNamespace}[i]}}
	}))
	models := []client.Object{newModel(Namespace, littleModel, "/models/little.pb"), newModel(Namespace, bigModel, "/models/big.pb"),
		newModel(Namespace, flModel, "/models/fl.pb")}
	h.check(h.createAll(ctx, len(models), func(i int) client.Object { return models[i] }))
	h.check(h.createAll(ctx, n, func(i int) client.Object { return newDataset(Namespace, i) }))

	p0, err := sampleProc(h.controller.Pid())
	h.check(err)
	h0, err := scrapeHistograms(h.metricsURL, "controller_runtime_reconcile_time_seconds", "controller")
	h.check(err)
	costs := h.openCostWindow()
	began := time.Now()
	h.check(h.createAll(ctx, 2*n, func(i int) client.Object {
		if i%2 == 0 {
			return newJI(Namespace, i/2, h.cfg.CloudNodes)
		}
		return newFL(Namespace, i/2, n, h.cfg.CloudNodes)
	}))
	h.progress("Lifeline: %d workloads created in %v", 2*n, time.Since(began).Round(time.Millisecond))
	// Per JI: the edge and cloud Deployments and the cloud Service; per FL job: the aggregator, the trainers and
	// the aggregation Service.
	r.Children = n * (3 + 2 + TrainersPerJob)
	last := h.waitChildren(Namespace, r.Children)
	r.ChildrenLifeline = last.Sub(began)
	h.progress("Lifeline: %d children of %d workloads in %v", r.Children, 2*n, r.ChildrenLifeline.Round(time.Millisecond))
	costs.report("Lifeline's children")

	h.waitFor(time.Minute+time.Duration(n)*600*time.Millisecond, "every worker Alive in its workload's status", func() (bool, error) {
		alive, others := h.aliveWorkers()
		if len(others) > 3 {
			others = others[:3]
		}
		return alive == r.Workers, fmt.Errorf("%d of %d workers Alive; not: %v", alive, r.Workers, others)
	})
	r.StatusSettled = time.Since(began)
	p1, err := sampleProc(h.controller.Pid())
	h.check(err)
	h1, err := scrapeHistograms(h.metricsURL, "controller_runtime_reconcile_time_seconds", "controller")
	h.check(err)
	r.ControllerCores = cores(p0, p1)
	r.Reconciles, r.ReconcileP50, r.ReconcileP99 = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for name, hist := range h1 {
		d := hist.minus(h0[name])
		r.Reconciles[name], r.ReconcileP50[name], r.ReconcileP99[name] = d.count(), d.quantile(0.5), d.quantile(0.99)
	}
	h.progress("every status Alive in %v", r.StatusSettled.Round(time.Millisecond))
	h.measureArming(r, began)
}

// measureArming waits, when stand-ins are armed, until every edge worker's stand-in has its mirror pod, then reads
// what the control plane holds in memory with them: the cost of arming, beside a run with it off.
func (h *scaleRun) measureArming(r *Result, began time.Time) {
	if h.armer != nil {
		want := int64(h.cfg.Nodes * (1 + TrainersPerJob))
		h.waitFor(time.Minute+time.Duration(h.cfg.Nodes)*100*time.Millisecond, "every edge worker's stand-in armed", func() (bool, error) {
			return h.armer.created.Load() >= want, errors.New(h.armer.String())
		})
		r.StandInsArmed, r.Armed = int(h.armer.created.Load()), h.armer.lastCreated().Sub(began)
		h.progress("%s, the last %v after the first creation", h.armer, r.Armed.Round(time.Millisecond))
		h.waitFor(time.Minute, "every stand-in's mirror pod Running at its gate, not Ready", func() (bool, error) {
			pods, err := h.kube.CoreV1().Pods(Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: lifelinev1.StandInLabel})
			if err != nil {
				return false, err
			}
			atGate := 0
			for i := range pods.Items {
				if pods.Items[i].Status.Phase == corev1.PodRunning && podReady(&pods.Items[i]) == corev1.ConditionFalse {
					atGate++
				}
			}
			return atGate == len(pods.Items) && atGate >= int(want), fmt.Errorf("%d of %d stand-ins' mirror pods Running and not Ready", atGate, len(pods.Items))
		})
	}
	for _, p := range h.cp.Components() {
		rss := &r.APIServerRSS
		switch p.Name() {
		case "kube-apiserver":
		case "etcd":
			rss = &r.EtcdRSS
		default:
			continue
		}
		sample, err := sampleProc(p.Pid())
		h.check(err)
		*rss = sample.rss
	}
}

// aliveWorkers counts the worker records that are Alive across every workload, and describes the others.
func (h *scaleRun) aliveWorkers() (int, []string) {
	ctx := context.Background()
	alive := 0
	var others []string
	jis := &v1alpha1.JointInferenceServiceList{}
	fls := &v1alpha1.FederatedLearningJobList{}
	if err := errors.Join(h.cache.List(ctx, jis, client.InNamespace(Namespace), client.UnsafeDisableDeepCopy), h.cache.List(ctx, fls, client.InNamespace(Namespace), client.UnsafeDisableDeepCopy)); err != nil {
		return 0, []string{err.Error()}
	}
	count := func(ws []v1alpha1.WorkerStatus) {
		for _, w := range ws {
			if w.Liveness == v1alpha1.LivenessAlive {
				alive++
			} else {
				others = append(others, fmt.Sprintf("%s %s/%s/%s", w.Name, w.Phase, w.Liveness, w.Source))
			}
		}
	}
	for _, ji := range jis.Items {
		count(ji.Status.Workers)
	}
	for _, fl := range fls.Items {
		count(fl.Status.Workers)
	}
	return alive, others
}

// rawPodLabel marks the anchor's pods, which have no owner to tell them by.
const rawPodLabel = "scale.lifeline.sedna.io/raw"

// measureRaw creates, with a plain client, copies of every child Lifeline made, and times it.
func (h *scaleRun) measureRaw(ctx context.Context, r *Result) {
	var objs []client.Object
	deployments := &appsv1.DeploymentList{}
	services := &corev1.ServiceList{}
	pods := &corev1.PodList{}
	h.check(h.c.List(ctx, deployments, client.InNamespace(Namespace)))
	h.check(h.c.List(ctx, services, client.InNamespace(Namespace)))
	h.check(h.c.List(ctx, pods, client.InNamespace(Namespace)))
	for i := range deployments.Items {
		d := deployments.Items[i].DeepCopy()
		rawMeta(&d.ObjectMeta)
		dropSednaLabels(d.Labels)
		d.Status = appsv1.DeploymentStatus{}
		delete(d.Spec.Template.Labels, contract.RoleLabel)
		if d.Spec.Selector != nil {
			delete(d.Spec.Selector.MatchLabels, contract.RoleLabel)
		}
		objs = append(objs, d)
	}
	for i := range services.Items {
		s := services.Items[i].DeepCopy()
		rawMeta(&s.ObjectMeta)
		dropSednaLabels(s.Labels)
		s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Status = "", nil, corev1.ServiceStatus{}
		delete(s.Spec.Selector, contract.RoleLabel)
		objs = append(objs, s)
	}
	for i := range pods.Items {
		p := pods.Items[i].DeepCopy()
		if c := metav1.GetControllerOf(p); c == nil || c.Kind != "FederatedLearningJob" {
			continue
		}
		rawMeta(&p.ObjectMeta)
		p.Labels[rawPodLabel] = "true"
		p.Status = corev1.PodStatus{}
		objs = append(objs, p)
	}
	if len(objs) != r.Children {
		h.check(fmt.Errorf("the workloads' namespace holds %d children, want %d", len(objs), r.Children))
	}
	costs := h.openCostWindow()
	began := time.Now()
	h.check(h.createAll(ctx, len(objs), func(i int) client.Object { return objs[i] }))
	r.ChildrenRaw = h.waitChildren(RawNamespace, len(objs)).Sub(began)
	h.progress("anchor: %d children created by a client in %v", len(objs), r.ChildrenRaw.Round(time.Millisecond))
	costs.report("anchor's children")
}

// rawMeta makes the metadata of a child Lifeline made that of an object a user creates in RawNamespace. Without
// Lifeline's role label, the anchor's pods stay out of the controller's cache, as any pod not Lifeline's does.
func rawMeta(m *metav1.ObjectMeta) {
	*m = metav1.ObjectMeta{Name: m.Name, Namespace: RawNamespace, Labels: m.Labels, Annotations: m.Annotations}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	delete(m.Labels, contract.RoleLabel)
}

// dropSednaLabels removes Sedna's labels (<kind>.sedna.io/…) from a copy's own labels, not from its selector or
// pod template: another user's Deployments and Services carry none, and the controller's cache then holds them as
// it holds any of theirs (a Deployment not at all, a Service as every Service of the cluster).
func dropSednaLabels(labels map[string]string) {
	for k := range labels {
		if strings.Contains(k, ".sedna.io/") {
			delete(labels, k)
		}
	}
}

// measureSteady measures the controller's CPU while only heartbeats flow, then while every JI edge worker also
// reports its counters every ReportInterval, each report changing its service's status.
func (h *scaleRun) measureSteady(r *Result) {
	time.Sleep(h.cfg.SteadyWindow / 4) // let the anchor's pods and what they wake go by
	r.IngestionCores, r.MessagesPerSecond, _ = h.window("heartbeats")
	h.progress("heartbeats: %.3f cores at %.0f messages/s", r.IngestionCores, r.MessagesPerSecond)
	stop := h.reportEvery(ReportInterval)
	defer stop()
	time.Sleep(ReportInterval) // the first reports' status writes
	r.ReportingCores, r.ReportingMessagesPerSecond, r.ReportsPerSecond = h.window("reports")
	h.progress("heartbeats and reports: %.3f cores at %.0f messages/s, %.1f of them reports", r.ReportingCores,
		r.ReportingMessagesPerSecond, r.ReportsPerSecond)
}

// ReportInterval is how often each JI edge worker reports in the second steady window.
const ReportInterval = 2 * time.Second

// window is the controller's CPU, in cores, and the messages and the reports per second its table accepted, over
// SteadyWindow. With a profile directory, the controller's CPU profile of the window is saved there as
// cpu-<name>-<nodes>.pprof.
func (h *scaleRun) window(name string) (controllerCores, messages, reports float64) {
	m0, r0, err := h.messages()
	h.check(err)
	p0, err := sampleProc(h.controller.Pid())
	h.check(err)
	if h.cfg.ProfileDir != "" {
		path := filepath.Join(h.cfg.ProfileDir, fmt.Sprintf("cpu-%s-%d.pprof", name, h.cfg.Nodes))
		profile := fmt.Sprintf("profile?seconds=%d", int(h.cfg.SteadyWindow.Seconds()))
		h.check(h.saveProfile(profile, path)) // it takes the window's time
	} else {
		time.Sleep(h.cfg.SteadyWindow) // the window measured
	}
	p1, err := sampleProc(h.controller.Pid())
	h.check(err)
	m1, r1, err := h.messages()
	h.check(err)
	took := p1.at.Sub(p0.at).Seconds()
	return cores(p0, p1), (m1 - m0) / took, (r1 - r0) / took
}

// reportEvery makes each node's agent report its JI edge worker's counters every interval, as Sedna's worker
// library does, until the returned func is called.
func (h *scaleRun) reportEvery(interval time.Duration) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, node := range h.fleet.nodes() {
		a := h.fleet.agents[node]
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 1; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				_ = a.publishReport(Namespace, jointinference.DeploymentName(jiName(i), "edge"), reportBody(jiName(i), n))
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// messages is how many messages the controller's liveness table accepted so far, and how many of them were
// workers' reports.
func (h *scaleRun) messages() (all, reports float64, err error) {
	byKind, err := scrapeGauges(h.metricsURL, "lifeline_liveness_messages_total", "kind")
	for _, n := range byKind {
		all += n
	}
	return all, byKind[lifelinev1.KindReport.String()], err
}

// measureDetection kills, one after the other, the JI edge workers of nodes cut off from the API server while
// every node publishes, and times each death until the status shows it.
func (h *scaleRun) measureDetection(ctx context.Context, step string) []time.Duration {
	var detect []time.Duration
	nodes := h.fleet.nodes()[:h.cfg.DetectSamples]
	for _, node := range nodes {
		h.fleet.agents[node].setReachable(false)
	}
	for i := range nodes {
		h.waitEdgeRecord(i, "the edge worker in its agent's word", func(w v1alpha1.WorkerStatus) bool {
			return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
		})
	}
	costs := h.openCostWindow()
	for i, node := range nodes {
		pod := h.edgePod(ctx, i)
		a := h.fleet.agents[node]
		began := time.Now()
		h.check(a.publishState(pod, lifelinev1.Phase_PHASE_FAILED))
		h.waitEdgeRecord(i, "the edge worker Dead in its agent's word", func(w v1alpha1.WorkerStatus) bool {
			return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessDead
		})
		detect = append(detect, time.Since(began))
		h.check(a.publishState(pod, lifelinev1.Phase_PHASE_RUNNING)) // the node restarted it
	}
	for _, node := range nodes {
		h.fleet.agents[node].setReachable(true)
	}
	h.progress("%s: %d deaths on cut-off nodes, p50 %v, p99 %v", step, len(detect),
		harness.Percentile(detect, 50).Round(time.Millisecond), harness.Percentile(detect, 99).Round(time.Millisecond))
	costs.report(step)
	return detect
}

// waitQueuesDrained waits until neither controller has a pass queued: what the workloads' creation and the
// reporting window called for is done, and the next step meets only what it sets off and the heartbeats.
func (h *scaleRun) waitQueuesDrained() {
	h.waitEvery(time.Second, 20*time.Minute, "the controller's work queues to drain", func() (bool, error) {
		depth, err := scrapeGauges(h.metricsURL, "workqueue_depth", "name")
		if err != nil {
			return false, err
		}
		queued := depth["jointinferenceservice"] + depth["federatedlearningjob"]
		return queued == 0, fmt.Errorf("%.0f passes queued", queued)
	})
	h.progress("the controller's work queues are empty")
}

// measureRestartReconnect stops the controller and starts it again, as an upgrade or the loss of the leader does:
// every agent's session ends with the embedded broker. RestartReconnect is from the new controller's start until
// every agent has its session again; RestartPeakAttempts the most sessions the fleet tried in one second, from
// the stop on: what the agents' back-off spares the broker.
func (h *scaleRun) measureRestartReconnect(r *Result) {
	peak, last, lastAt := 0.0, h.fleet.attempts(), time.Now()
	sample := func() {
		if now := time.Now(); now.Sub(lastAt) >= time.Second {
			a := h.fleet.attempts()
			peak = max(peak, float64(a-last)/now.Sub(lastAt).Seconds())
			last, lastAt = a, now
		}
	}
	h.controller.Stop(10 * time.Second)
	h.waitEvery(100*time.Millisecond, time.Minute, "every agent's session ended with the controller", func() (bool, error) {
		sample()
		n := h.fleet.connected()
		return n == 0, fmt.Errorf("%d agents still connected", n)
	})
	var err error
	h.controller, err = h.controllerLaunch("lifeline-controller-restarted")
	h.check(err)
	started := time.Now()
	h.progress("controller restarted")
	h.waitEvery(100*time.Millisecond, 5*time.Minute, "every agent connected to the restarted controller", func() (bool, error) {
		sample()
		n := h.fleet.connected()
		return n == h.cfg.Nodes, fmt.Errorf("%d of %d agents connected", n, h.cfg.Nodes)
	})
	r.RestartReconnect, r.RestartPeakAttempts = time.Since(started), peak
	h.progress("every agent back %.1fs after the controller's restart, at most %.0f session attempts a second", r.RestartReconnect.Seconds(), peak)
}

// measureMassCutoff cuts CutOff nodes off at once. It times until every status of their workers is in the
// agents' word, then waits for the node lifecycle controller to mark them not Ready and checks the statuses kept
// the agents' word.
func (h *scaleRun) measureMassCutoff(ctx context.Context, r *Result) {
	all := h.fleet.nodes()
	cut := all[len(all)-h.cfg.CutOff:]
	costs := h.openCostWindow()
	began := time.Now()
	r.MassCutoff, r.CutOffWorkers = h.cutOff(ctx, cut)
	h.progress("mass cut-off: %d workers of %d nodes in their agents' word in %v", r.CutOffWorkers, len(cut), r.MassCutoff.Round(time.Millisecond))
	costs.report("mass cut-off")
	h.waitNotReady(ctx, cut)
	r.NodesUnknown = time.Since(began)
	// The reconciles the Ready flips woke write their statuses meanwhile: none may take a worker out of its
	// agent's word.
	testkit.Sample(h.t, 250*time.Millisecond, 2*time.Second, func(context.Context) error {
		if t := h.workloads().records(nodeSet(cut), inAgentsWord); t.matching != t.total {
			return fmt.Errorf("after the nodes turned not Ready: %v of %v workers on cut-off nodes in their agent's word (JI, FL)", t.matching, t.total)
		}
		return nil
	})
	h.mend(ctx, cut)
	h.waitQuiet()
}

// quietAPIServer turns off kube-apiserver's check of its watch cache against etcd (on by default since 1.34):
// every five to seven and a half minutes it lists each resource whole from etcd and digests it, in whichever
// window that falls. In one run at 1,000 nodes it took 2.4 s of the API server's CPU in the profile of Lifeline's
// outage and 0.6 s in its anchor's: a ratio should not depend on that draw.
const quietAPIServer = "--feature-gates=DetectCacheInconsistency=false"

// waitQuiet waits until what the steps before set off has died down: no pass queued, and three seconds in a row
// in which the API server took no write but kwok's Lease renewals (the node lifecycle controller marking nodes
// and their pods, the Deployment controller counting them, the passes and Events that follow). The next step then
// meets only what it sets off itself. kwok does not make a node it takes back Ready again (its stages act on new
// Nodes and Pods only), so the nodes a step cut stay not Ready, as do their pods, whose workers the status keeps
// Alive.
func (h *scaleRun) waitQuiet() {
	last, quiet := -1.0, 0
	h.waitEvery(time.Second, 10*time.Minute, "the API server to take no write but kwok's Leases", func() (bool, error) {
		writes := h.writesTaken()
		if writes == last {
			quiet++
		} else {
			quiet = 0
		}
		last = writes
		return quiet >= 3, fmt.Errorf("%.0f writes taken, the last %d s none", writes, quiet)
	})
	h.waitQueuesDrained()
}

// writesTaken counts the writes the API server has taken, but for Leases.
func (h *scaleRun) writesTaken() float64 {
	metrics, err := h.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	h.check(err)
	requests, err := parseGauges(bytes.NewReader(metrics), "apiserver_request_total", "verb", "resource", "subresource")
	h.check(err)
	writes := 0.0
	for key, n := range requests {
		verb, resource, _ := strings.Cut(key, "/")
		if resource != "leases" && (verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE") {
			writes += n
		}
	}
	return writes
}

// measureOutage cuts every edge node off at once, a region's outage, and times until every status is in the
// agents' word; once the outage has lasted the node lifecycle controller's grace, so that it turns nodes not
// Ready, it mends them all at once and times until every status is back in the API server's word.
func (h *scaleRun) measureOutage(ctx context.Context, r *Result) {
	all := h.fleet.nodes()
	profiled := h.profileCPU(ctx, "outage", 20*time.Second)
	costs := h.openCostWindow()
	began := time.Now()
	r.OutageAll, _ = h.cutOff(ctx, all)
	h.progress("outage: every worker of %d nodes in its agent's word in %v", len(all), r.OutageAll.Round(time.Millisecond))
	costs.report("outage")
	profiled()
	h.waitOutTheGrace(ctx, "outage", began, all)
	profiled = h.profileCPU(ctx, "heal", 20*time.Second)
	costs = h.openCostWindow()
	r.OutageHeal = h.mend(ctx, all)
	h.progress("outage healed: every worker of %d nodes in the API server's word in %v", len(all), r.OutageHeal.Round(time.Millisecond))
	costs.report("outage healed")
	profiled()
}

// waitOutTheGrace waits until the outage of nodes that began then has lasted the node lifecycle controller's
// grace and a little more, and it has marked a node not Ready: not until every node is, since at 1,000 nodes down
// it marks them over minutes.
func (h *scaleRun) waitOutTheGrace(ctx context.Context, outage string, began time.Time, nodes []string) {
	set := nodeSet(nodes)
	h.waitFor(2*time.Minute+h.cfg.NodeGrace, "a node marked not Ready", func() (bool, error) {
		if since := time.Since(began); since < h.cfg.NodeGrace+5*time.Second {
			return false, fmt.Errorf("the %s lasted %v", outage, since.Round(time.Second))
		}
		return h.notReady(ctx, set) > 0, errors.New("no node marked not Ready")
	})
	h.progress("%s: %d of %d nodes marked not Ready after %v", outage, h.notReady(ctx, set), len(nodes), time.Since(began).Round(time.Second))
}

// profileCPU saves, with a profile directory, the controller's, the API server's and the harness's own (its
// simulated agents and caches) CPU profiles of the next period as cpu-<name>-{controller,apiserver,harness}-
// <nodes>.pprof, and what the controller allocated in it as allocs-<name>-controller-<nodes>.pprof; the returned
// function waits for them.
func (h *scaleRun) profileCPU(ctx context.Context, name string, period time.Duration) (wait func()) {
	if h.cfg.ProfileDir == "" {
		return func() {}
	}
	path := func(who string) string {
		return filepath.Join(h.cfg.ProfileDir, fmt.Sprintf("cpu-%s-%s-%d.pprof", name, who, h.cfg.Nodes))
	}
	seconds := strconv.Itoa(int(period.Seconds()))
	var wg sync.WaitGroup
	var controllerErr, allocsErr, apiserverErr, harnessErr error
	wg.Go(func() { controllerErr = h.saveProfile("profile?seconds="+seconds, path("controller")) })
	wg.Go(func() {
		allocs := filepath.Join(h.cfg.ProfileDir, fmt.Sprintf("allocs-%s-controller-%d.pprof", name, h.cfg.Nodes))
		allocsErr = h.saveProfile("allocs?seconds="+seconds, allocs)
	})
	wg.Go(func() { harnessErr = profileSelf(path("harness"), period) })
	wg.Go(func() {
		var data []byte
		data, apiserverErr = h.kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", seconds).
			Timeout(period + time.Minute).DoRaw(ctx)
		if apiserverErr == nil {
			apiserverErr = os.WriteFile(path("apiserver"), data, 0o644)
		}
	})
	return func() {
		wg.Wait()
		h.check(errors.Join(controllerErr, allocsErr, apiserverErr, harnessErr))
	}
}

// profileSelf writes this process's CPU profile of the next period to path.
func profileSelf(path string, period time.Duration) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("profiling the harness (go test -cpuprofile?): %w", err)
	}
	time.Sleep(period) // the period profiled
	pprof.StopCPUProfile()
	return f.Close()
}

// cutOff does to nodes what an outage does: their agents say they lost the API server, and kwok stops renewing
// their Leases. It returns when every worker status on them is in its agent's word: how long that took, and how
// many workers there are.
func (h *scaleRun) cutOff(ctx context.Context, nodes []string) (took time.Duration, workers int) {
	// kwok leaves the nodes before the clock starts: taking its label off is the harness's own request per node,
	// which a real outage does not make (its nodes simply stop posting), and the node lifecycle controller's
	// grace (40 s) dwarfs the seconds it takes.
	h.check(h.labelNodes(ctx, nodes, "null"))
	began := time.Now()
	for _, n := range nodes {
		h.fleet.agents[n].setReachable(false)
	}
	return h.waitRecords(h.workloads(), began, nodeSet(nodes), "in their agents' word", inAgentsWord)
}

// mend undoes cutOff and returns when every worker status on nodes is in the API server's word again.
func (h *scaleRun) mend(ctx context.Context, nodes []string) time.Duration {
	// kwok takes the nodes back before the clock starts, as it left them: its label is the harness's own request
	// per node, which a region coming back does not make. kwok's Lease renewals and lists of each node's pods
	// that follow still share the clock's seconds, as the nodes' own would.
	h.check(h.labelNodes(ctx, nodes, `"`+kwokValue+`"`))
	began := time.Now()
	for _, n := range nodes {
		h.fleet.agents[n].setReachable(true)
	}
	took, _ := h.waitRecords(h.workloads(), began, nodeSet(nodes), "in the API server's word", inAPIServersWord)
	return took
}

// waitRecords waits until every worker record of in on nodes matches, and returns how long that took from began
// and how many records there are. It prints when each kind's records were done, since the two kinds' passes run
// in separate work queues and either may be the tail.
func (h *scaleRun) waitRecords(in workloadsIn, began time.Time, nodes map[string]bool, what string, match func(v1alpha1.WorkerStatus) bool) (took time.Duration, workers int) {
	var done [2]time.Duration
	h.waitFor(5*time.Minute, "every worker record on the nodes "+what, func() (bool, error) {
		t := in.records(nodes, match)
		for kind := range done {
			if done[kind] == 0 && t.total[kind] > 0 && t.matching[kind] == t.total[kind] {
				done[kind] = time.Since(began)
			}
		}
		workers = t.total[jiKind] + t.total[flKind]
		matching := t.matching[jiKind] + t.matching[flKind]
		return workers > 0 && matching == workers, fmt.Errorf("%d of %d worker records on the nodes %s", matching, workers, what)
	})
	h.progress("the JointInferenceServices' records %s after %v, the FederatedLearningJobs' after %v",
		what, done[jiKind].Round(time.Millisecond), done[flKind].Round(time.Millisecond))
	return time.Since(began), workers
}

// labelNodes sets kwok's label on nodes to value, JSON (null: removed, and kwok no longer renews their Leases).
func (h *scaleRun) labelNodes(ctx context.Context, nodes []string, value string) error {
	patch := []byte(`{"metadata":{"labels":{"` + KwokLabel + `":` + value + `}}}`)
	return h.forAll(len(nodes), func(i int) error {
		_, err := h.kube.CoreV1().Nodes().Patch(ctx, nodes[i], types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// waitNotReady waits for the node lifecycle controller to mark nodes not Ready.
func (h *scaleRun) waitNotReady(ctx context.Context, nodes []string) {
	set := nodeSet(nodes)
	h.waitFor(2*time.Minute+h.cfg.NodeGrace, "the node lifecycle controller to mark the cut-off nodes not Ready", func() (bool, error) {
		down := h.notReady(ctx, set)
		return down == len(nodes), fmt.Errorf("%d of %d cut-off nodes not Ready", down, len(nodes))
	})
}

// notReady counts the nodes of set whose Ready condition is not True (-1: the nodes could not be listed).
func (h *scaleRun) notReady(ctx context.Context, set map[string]bool) int {
	list, err := h.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return -1
	}
	down := 0
	for _, n := range list.Items {
		if set[n.Name] && nodeReady(&n) != corev1.ConditionTrue {
			down++
		}
	}
	return down
}

func nodeSet(nodes []string) map[string]bool {
	set := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		set[n] = true
	}
	return set
}

// inAgentsWord tells whether a worker's status is its agent's: alive, by the agent.
func inAgentsWord(w v1alpha1.WorkerStatus) bool {
	return w.Source == v1alpha1.StatusSourceAgent && w.Liveness == v1alpha1.LivenessAlive
}

// inAPIServersWord tells whether a worker's status is the API server's.
func inAPIServersWord(w v1alpha1.WorkerStatus) bool {
	return w.Source == v1alpha1.StatusSourceAPIServer
}

// jiKind and flKind index a recordTally by the kind of workload a record belongs to.
const (
	jiKind = iota
	flKind
)

// recordTally counts worker records by the kind of their workload (jiKind, flKind).
type recordTally struct{ matching, total [2]int }

// workloadsIn is where worker records are read from: a cache and the namespace of the workloads in it.
type workloadsIn struct {
	cache     client.Reader
	namespace string
}

// workloads are Lifeline's workloads, as the harness's cache holds them.
func (h *scaleRun) workloads() workloadsIn { return workloadsIn{h.cache, Namespace} }

// records counts the edge and trainer records on nodes, and those that match, by kind (total -1: the cache
// could not be read).
func (in workloadsIn) records(nodes map[string]bool, match func(v1alpha1.WorkerStatus) bool) (t recordTally) {
	ctx := context.Background()
	jis := &v1alpha1.JointInferenceServiceList{}
	fls := &v1alpha1.FederatedLearningJobList{}
	if in.cache.List(ctx, jis, client.InNamespace(in.namespace), client.UnsafeDisableDeepCopy) != nil ||
		in.cache.List(ctx, fls, client.InNamespace(in.namespace), client.UnsafeDisableDeepCopy) != nil {
		return recordTally{total: [2]int{-1, -1}}
	}
	count := func(kind int, ws []v1alpha1.WorkerStatus) {
		for _, w := range ws {
			if nodes[w.Node] {
				t.total[kind]++
				if match(w) {
					t.matching[kind]++
				}
			}
		}
	}
	for _, ji := range jis.Items {
		count(jiKind, ji.Status.Workers)
	}
	for _, fl := range fls.Items {
		count(flKind, fl.Status.Workers)
	}
	return t
}

// edgePod is the pod of the i-th JI's edge worker.
func (h *scaleRun) edgePod(ctx context.Context, i int) *corev1.Pod {
	pods := &corev1.PodList{}
	h.check(h.cache.List(ctx, pods, client.InNamespace(Namespace), client.MatchingLabels{contract.RoleLabel: "edge"}))
	for j := range pods.Items {
		if p := &pods.Items[j]; p.Spec.NodeName == EdgeNodeName(i) && p.DeletionTimestamp == nil && !contract.IsMirrorPod(p) {
			return p
		}
	}
	h.check(fmt.Errorf("no edge pod on %s", EdgeNodeName(i)))
	return nil
}

// waitEdgeRecord waits, polling the harness's cache every 5 ms, until the i-th JI's edge worker record satisfies ok.
func (h *scaleRun) waitEdgeRecord(i int, what string, ok func(v1alpha1.WorkerStatus) bool) {
	key := client.ObjectKey{Namespace: Namespace, Name: jiName(i)}
	h.waitEvery(5*time.Millisecond, time.Minute, what+" of "+key.String(), func() (bool, error) {
		ji := &v1alpha1.JointInferenceService{}
		if err := h.cache.Get(context.Background(), key, ji); err != nil {
			return false, err
		}
		for _, w := range ji.Status.Workers {
			if w.Role == v1alpha1.WorkerRoleEdge {
				return ok(w), fmt.Errorf("record %+v", w)
			}
		}
		return false, fmt.Errorf("no edge record in %+v", ji.Status.Workers)
	})
}

// measureRecreation deletes the first JI's edge Deployment again and again, and, as the anchor, the ReplicaSet of
// the anchor's copy of that Deployment, which the Deployment controller re-creates.
func (h *scaleRun) measureRecreation(r *Result) {
	h.waitDeploymentControllerIdle() // the cut-off nodes' pods turned not ready
	r.RecreateJI = measureDeploymentRecreation(h.t, h.kube, Namespace, jointinference.DeploymentName(jiName(0), "edge"), h.cfg.Recreations)
	r.RecreateRS = measureReplicaSetRecreation(h.t, h.kube, RawNamespace, jointinference.DeploymentName(jiName(0), "edge"), h.cfg.Recreations)
	h.progress("re-creation: %d and %d samples", len(r.RecreateJI), len(r.RecreateRS))
}

// waitDeploymentControllerIdle waits until kube-controller-manager's Deployment controller has caught up with
// every Deployment. At 20 requests a second, the ReplicaSets and pods of thousands of Deployments take it
// minutes; on a small machine its backlog competes with everything measured after the children, and the anchor
// would time a re-creation queued behind it.
func (h *scaleRun) waitDeploymentControllerIdle() {
	h.waitEvery(time.Second, 20*time.Minute, "the Deployment controller to catch up with every Deployment", func() (bool, error) {
		behind := 0
		for _, ns := range []string{Namespace, RawNamespace} {
			list, err := h.kube.AppsV1().Deployments(ns).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, d := range list.Items {
				want := int32(1)
				if d.Spec.Replicas != nil {
					want = *d.Spec.Replicas
				}
				// Not "available": the pods on the nodes cut off just before are no longer ready.
				if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != want {
					behind++
				}
			}
		}
		return behind == 0, fmt.Errorf("%d Deployments not yet rolled out", behind)
	})
	h.progress("the Deployment controller has caught up")
}

// waitChildren waits until n children of namespace have been seen and returns when the last one appeared.
func (h *scaleRun) waitChildren(namespace string, n int) time.Time {
	var last time.Time
	h.waitFor(20*time.Minute, fmt.Sprintf("%d children in %s", n, namespace), func() (bool, error) {
		got, at := h.seen.count(namespace)
		last = at
		return got >= n, fmt.Errorf("%d of %d children", got, n)
	})
	return last
}

func (h *scaleRun) waitFor(timeout time.Duration, what string, cond func() (bool, error)) {
	h.t.Helper()
	h.waitEvery(100*time.Millisecond, timeout, what, cond)
}

func (h *scaleRun) waitEvery(every, timeout time.Duration, what string, cond func() (bool, error)) {
	h.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), every, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		h.check(fmt.Errorf("timed out after %v waiting for %s: %v", timeout, what, last))
	}
}

// createAll creates the objects obj(0..n-1) with Parallelism requests in flight; one that exists already is fine.
func (h *scaleRun) createAll(ctx context.Context, n int, obj func(i int) client.Object) error {
	return h.forAll(n, func(i int) error {
		o := obj(i)
		if err := h.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
		return nil
	})
}

// forAll runs do(0..n-1) with Parallelism calls at once and returns the first error.
func (h *scaleRun) forAll(n int, do func(i int) error) error {
	return h.forEach(h.cfg.Parallelism, n, do)
}

// forEach calls do(0..n-1) from workers goroutines and returns the first error.
func (h *scaleRun) forEach(workers, n int, do func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// seenObjects remembers when each object was first seen, by namespace.
type seenObjects struct {
	mu    sync.Mutex
	first map[string]time.Time // by kind/namespace/name
	byNS  map[string]int
	last  map[string]time.Time
}

func newSeenObjects() *seenObjects {
	return &seenObjects{first: map[string]time.Time{}, byNS: map[string]int{}, last: map[string]time.Time{}}
}

func (s *seenObjects) add(o client.Object) {
	key := fmt.Sprintf("%T/%s/%s", o, o.GetNamespace(), o.GetName())
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.first[key]; ok {
		return
	}
	s.first[key] = now
	s.byNS[o.GetNamespace()]++
	s.last[o.GetNamespace()] = now
}

// count is how many objects of namespace were seen, and when the latest first appeared.
func (s *seenObjects) count(namespace string) (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byNS[namespace], s.last[namespace]
}

func nodeReady(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// writeCredentials gives every edge node an MQTT password, as the controller's mounted Secret would.
func writeCredentials(dir string, nodes []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the credentials directory: %w", err)
	}
	for _, n := range nodes {
		secret := make([]byte, 16)
		if _, err := rand.Read(secret); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, n), []byte(hex.EncodeToString(secret)), 0o600); err != nil {
			return fmt.Errorf("writing the MQTT password of %s: %w", n, err)
		}
	}
	return nil
}

var (
	buildOnce  sync.Once
	builtDir   string
	builtPath  string
	builtError error
)

// controllerBinary builds cmd/lifeline-controller of this tree once per process, so what is measured is the code
// at hand, never a stale binary in bin/. It builds with make build's flags, whose compiles it then reuses.
func controllerBinary(root string) (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lifeline-scale-bin-")
		if err != nil {
			builtError = fmt.Errorf("creating a directory for the controller binary: %w", err)
			return
		}
		builtDir, builtPath = dir, filepath.Join(dir, "lifeline-controller")
		cmd := exec.Command("go", "build", "-trimpath", "-o", builtPath, "./cmd/lifeline-controller")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			builtError = fmt.Errorf("building lifeline-controller: %w\n%s", err, out)
		}
	})
	return builtPath, builtError
}

// RemoveBuilds removes what controllerBinary built; a TestMain calls it once the tests are done.
func RemoveBuilds() {
	if builtDir != "" {
		_ = os.RemoveAll(builtDir)
	}
}

// reportBody is a Sedna report of a JI edge worker's counters.
func reportBody(ji string, inferences int) []byte {
	body, _ := json.Marshal(lifelinev1.Report{Name: jointinference.DeploymentName(ji, "edge"), Namespace: Namespace,
		OwnerName: ji, OwnerKind: "jointinferenceservice", Kind: "inference", Status: "running",
		OwnerInfo: map[string]any{"inferenceNumber": inferences, "hardExampleNumber": inferences / 10, "uploadCloudRatio": 0.1}})
	return body
}
