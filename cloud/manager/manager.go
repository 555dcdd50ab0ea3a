// Package manager builds Lifeline's controller manager: the scheme, the cache, and every controller, so the
// binary and the integration tests run the same wiring.
package manager

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/datasetstatus"
	"github.com/lifeline-edge/lifeline/cloud/desiredsets"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
	"github.com/lifeline-edge/lifeline/cloud/workload"
	"github.com/lifeline-edge/lifeline/internal/promreg"
)

// Options configure the manager.
type Options struct {
	// LeaderElection makes replicas elect one active controller; LeaderElectionNamespace is where the Lease is.
	LeaderElection          bool
	LeaderElectionNamespace string
	// MetricsAddr serves Prometheus metrics ("0" disables); HealthAddr serves /healthz and /readyz ("0" disables).
	MetricsAddr, HealthAddr string
	// MetricsSecure serves the metrics over HTTPS, to clients the API server authenticates (a bearer token, by
	// TokenReview) and authorizes to get the non-resource URL /metrics (by SubjectAccessReview).
	MetricsSecure bool
	// PprofAddr serves Go's profiles under /debug/pprof/ (empty or "0" disables).
	PprofAddr string
	// LCServer is the LC_SERVER handed to edge workers.
	LCServer string
	// MQTTAddress, when set, runs the embedded MQTT broker there (e.g. ":1883") and makes the controllers
	// edge-aware: they merge the agents' reports and send them restart commands.
	MQTTAddress string
	// MQTTBrokerURL, when set, replaces the embedded broker with an external one the controller connects to
	// (tcp:// or ssl://), as MQTTUsername with MQTTPassword.
	MQTTBrokerURL, MQTTUsername, MQTTPassword string
	// MQTTTLS, when set, makes the embedded broker's listener TLS, or is the external session's TLS.
	MQTTTLS *tls.Config
	// MQTTCredentialsDir holds one password file per node (a mounted Secret).
	MQTTCredentialsDir string
	// MQTTClientCAs, when set, let the embedded broker admit a node by the client certificate KubeEdge issued it
	// (KubeEdge's CA); MQTTRevokedCertificatesFile lists revoked serial numbers.
	MQTTClientCAs               *x509.CertPool
	MQTTRevokedCertificatesFile string
	// Clock is the controller's clock: the reconcilers' backoffs, deadlines and TTLs, and the validity of the
	// nodes' certificates (default: the real clock).
	Clock clock.PassiveClock
	// MQTTLimits bound the embedded broker's connections and retained messages (zero fields: the defaults).
	MQTTLimits broker.Limits
	// Cluster is this cluster's name in the MQTT topic tree.
	Cluster string
	// Namespaces, when not empty, are the only namespaces whose workloads Lifeline reconciles: its cache holds
	// nothing of the others (pods, Models, Secrets included), so a Sedna installation can keep the rest.
	Namespaces []string
	// Selector, when not nil or empty, selects the JointInferenceServices and FederatedLearningJobs Lifeline
	// reconciles by their labels; the others are not cached, so never touched.
	Selector labels.Selector
	// ConcurrentReconciles is how many workloads of each kind are reconciled at once; zero means
	// DefaultConcurrentReconciles.
	ConcurrentReconciles int
	// ReportStatusPeriod is how long a workload's status write waits after one of its workers reported, folding
	// the reports that arrive meanwhile; zero: at once, as a duration's zero means wherever Lifeline takes one
	// (the controller's flag defaults to edgeaware.DefaultReportPeriod).
	ReportStatusPeriod time.Duration
	// Restartable lets one process build the manager more than once (controller names are otherwise unique
	// per process), for tests that stop and start the controller.
	Restartable bool
	// Instrument, when set, is the manager every controller is registered with, made from the real one: tests
	// count the controllers' passes through it. Nil in production.
	Instrument func(ctrl.Manager) ctrl.Manager
}

// DefaultConcurrentReconciles is how many JointInferenceServices, and how many FederatedLearningJobs, are
// reconciled at once by default. One at a time, creating hundreds of workloads' children waits on each pass's
// requests to the API server in turn (3.3× a plain client's time at 100 nodes); 25 instead of 10 shortened
// nothing, as the API server's Service creations bound the passes then (docs/performance.md).
const DefaultConcurrentReconciles = 10

// ConditionYieldFor is how long the Nodes' LifelineAgent conditions wait at most for the workload passes queued
// before them: in a region's outage the workloads' statuses are written first, and the conditions within this of
// the agents' word even when the passes never drain.
const ConditionYieldFor = 30 * time.Second

// Scheme holds the built-in types and sedna.io/v1alpha1.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// New builds the manager with every controller registered. When the API server does not serve the sedna.io kinds
// yet (the CRDs are applied after the controller, or are not established yet), the controllers and the broker are
// set up once it does, while the manager runs: the controller waits rather than exits, and its readiness says
// what it waits for. When the API server cannot be asked, the same: the wait retries and logs why.
//
// Its readiness checks (served at opts.HealthAddr): crds, the sedna.io kinds are served and the controllers set
// up; caches, the cache has synced what it watches; broker (with MQTT), the elected replica's broker session is
// up. Its health check (ping) answers while the manager runs.
func New(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	if opts.LCServer == "" {
		opts.LCServer = contract.DefaultLCServer
	}
	if opts.ConcurrentReconciles == 0 {
		opts.ConcurrentReconciles = DefaultConcurrentReconciles
	}
	// Only worker pods are cached: a cluster's other pods are none of Lifeline's business, and neither are the
	// mirror pods of the edge agents' stand-ins (one beside each edge worker while stand-ins are armed), which
	// carry their workers' labels but are their nodes' to run: no pass reads them.
	workerPods := labels.NewSelector().Add(must(labels.NewRequirement(contract.RoleLabel, selection.Exists, nil)),
		must(labels.NewRequirement(contract.StandInLabel, selection.DoesNotExist, nil)))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "lifeline-controller.sedna.io",
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		Metrics:                 metricsOptions(opts),
		HealthProbeBindAddress:  opts.HealthAddr,
		PprofBindAddress:        opts.PprofAddr,
		Controller:              config.Controller{SkipNameValidation: ptr.To(opts.Restartable)},
		Cache:                   cacheOptions(opts, workerPods),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	disc, err := newDiscovery(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the discovery client: %w", err)
	}
	st := &startState{}
	if err := addProbes(mgr, st, opts); err != nil {
		return nil, err
	}
	gate := &crdGate{kinds: sednaKinds{disc}, address: cfg.Host, state: st, log: mgr.GetLogger().WithName("startup"),
		setup: func() error { return setUp(mgr, opts, st) }}
	// The usual case, CRDs applied first: everything is set up before New returns, as callers (tests) expect.
	if missing, err := gate.kinds.Missing(); err == nil && len(missing) == 0 {
		if err := setUp(mgr, opts, st); err != nil {
			return nil, err
		}
		st.established.Store(true)
		return mgr, nil
	}
	if err := mgr.Add(gate); err != nil {
		return nil, fmt.Errorf("adding the wait for the CRDs: %w", err)
	}
	return mgr, nil
}

// setUp registers the broker session, the liveness tracker and every controller with mgr. It needs the sedna.io
// kinds served: their informers are made here.
func setUp(mgr ctrl.Manager, opts Options, st *startState) error {
	if opts.Instrument != nil {
		mgr = opts.Instrument(mgr)
	}
	backlog := &workload.Backlog{}
	edge, err := addEdge(mgr, opts, st, backlog)
	if err != nil {
		return err
	}
	var now func() time.Time
	if opts.Clock != nil {
		now = opts.Clock.Now
	}
	statuses, err := workload.NewRESTStatusWriter(mgr.GetConfig(), mgr.GetHTTPClient(), mgr.GetScheme(), mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	deps := workload.Deps{
		Client:                  mgr.GetClient(),
		Statuses:                statuses,
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorder("lifeline-controller"),
		LCServer:                opts.LCServer,
		Edge:                    edge,
		Now:                     now,
		MaxConcurrentReconciles: opts.ConcurrentReconciles,
		Backlog:                 backlog,
	}
	if err := (&jointinference.Reconciler{Deps: deps}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the JointInferenceService controller: %w", err)
	}
	if err := (&federatedlearning.Reconciler{Deps: deps}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the FederatedLearningJob controller: %w", err)
	}
	if err := (&datasetstatus.Reconciler{Client: mgr.GetClient(), Edge: edge}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Dataset status controller: %w", err)
	}
	return nil
}

// metricsOptions serve the metrics at opts.MetricsAddr, over HTTPS behind the API server's authentication and
// authorization when opts.MetricsSecure (a certificate of its own, made at start: scrapers check the token, not
// the certificate, as for any controller-runtime manager).
func metricsOptions(opts Options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: opts.MetricsAddr}
	if opts.MetricsSecure {
		m.SecureServing, m.FilterProvider = true, filters.WithAuthenticationAndAuthorization
	}
	return m
}

// cacheOptions scopes the cache: worker pods only, in opts.Namespaces (all when empty), and of the workloads
// those opts.Selector selects. What the cache does not hold, no controller ever reads or acts on.
func cacheOptions(opts Options, workerPods labels.Selector) cache.Options {
	// Deployments and HPAs are JointInferenceServices' alone: only those with a service's name label (Lifeline's,
	// or Sedna's GM's to adopt) are cached, not every one of the cluster. One of another owner under a name Lifeline
	// needs is found when its creation is refused (jointinference.syncChild).
	jiChildren := labels.NewSelector().Add(must(labels.NewRequirement(contract.LabelPrefix(jointinference.Kind)+"name", selection.Exists, nil)))
	c := cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: workerPods, Transform: cachedWorkerPod},
		&corev1.Node{}:       {Transform: cachedNode},
		&appsv1.Deployment{}: {Label: jiChildren}, &autoscalingv2.HorizontalPodAutoscaler{}: {Label: jiChildren}},
		// Nothing reads who manages which field; the cache holds every Service of the cluster, and managedFields
		// are a large part of each object.
		DefaultTransform: cache.TransformStripManagedFields()}
	if len(opts.Namespaces) > 0 {
		c.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range opts.Namespaces {
			c.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if opts.Selector != nil && !opts.Selector.Empty() {
		c.ByObject[&v1alpha1.JointInferenceService{}] = cache.ByObject{Label: opts.Selector}
		c.ByObject[&v1alpha1.FederatedLearningJob{}] = cache.ByObject{Label: opts.Selector}
	}
	return c
}

func must(r *labels.Requirement, err error) labels.Requirement {
	if err != nil {
		panic(err) // the requirement is a constant's
	}
	return *r
}

// addEdge adds the liveness tracker and the broker session (embedded broker, or an external broker's client) to
// the manager; nil when neither is configured.
func addEdge(mgr ctrl.Manager, opts Options, st *startState, backlog nodecondition.Backlog) (*edgeaware.Edge, error) {
	if opts.MQTTAddress == "" && opts.MQTTBrokerURL == "" {
		return nil, nil
	}
	if opts.Cluster == "" {
		opts.Cluster = "default"
	}
	tracker, err := liveness.NewTracker(opts.Cluster, metrics.Registry, mgr.GetLogger().WithName("liveness"))
	if err != nil {
		return nil, err
	}
	// The tracker checks what a node says of a pod against the cache, and finds a report's pods by WORKER_NAME.
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, liveness.WorkerNameIndex, liveness.IndexWorkerName); err != nil {
		return nil, fmt.Errorf("indexing worker pods by WORKER_NAME: %w", err)
	}
	tracker.Pods = liveness.CachePods{Reader: mgr.GetClient()}
	tracker.Datasets = liveness.CacheDatasets{Reader: mgr.GetClient()}
	// Only edge Nodes get a record in the liveness table, and its prune forgets those that no longer are (once
	// silent), whichever broker: the table is bounded by the cluster's edge Nodes, not by every name it saw.
	tracker.Nodes = broker.CacheNodes{Reader: mgr.GetClient()}
	address := opts.MQTTAddress
	if opts.MQTTBrokerURL != "" {
		address = redactURL(opts.MQTTBrokerURL)
	}
	s := &sessionRunnable{external: opts.MQTTBrokerURL != "", address: address, log: mgr.GetLogger().WithName("broker"),
		open: func(ctx context.Context) (session, error) { return openSession(ctx, mgr, opts, tracker) }}
	st.session.Store(s)
	if err := promreg.Register(metrics.Registry, broker.SessionMetrics(s.embeddedBroker)); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if err := mgr.Add(s); err != nil {
		return nil, err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { tracker.Run(ctx); return nil })); err != nil {
		return nil, err
	}
	if err := addDesiredSets(mgr, opts, tracker, s); err != nil {
		return nil, err
	}
	// Each edge Node's LifelineAgent condition, from the same table.
	now := time.Now
	if opts.Clock != nil {
		now = opts.Clock.Now
	}
	neverHeard := prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifeline_edge_agents_never_heard",
		Help: "Edge Nodes whose Lifeline agent the controller has never heard (their LifelineAgent condition AgentNeverHeard)."})
	if err := promreg.Register(metrics.Registry, neverHeard); err != nil {
		return nil, err
	}
	if err := mgr.Add(&nodecondition.Writer{Client: mgr.GetClient(), Agents: tracker, Interval: time.Second, Rehear: 30 * time.Second,
		Backlog: backlog, YieldFor: ConditionYieldFor, Now: now, Log: mgr.GetLogger().WithName("nodecondition"),
		NeverHeard: neverHeard}); err != nil {
		return nil, err
	}
	return &edgeaware.Edge{Tracker: tracker, Commands: s, Nodes: mgr.GetClient(), ReportPeriod: max(opts.ReportStatusPeriod, 0)}, nil
}

// podChangeBatch is how long a node's set waits for more of its pods' changes: as the Job controller's batch of a
// job's pod updates, short beside a heartbeat.
const podChangeBatch = time.Second

// addDesiredSets sends each edge node's agent its workers and their stand-in manifests [P-DES-1]: when the agent
// begins a session, and when a worker pod of its node changes.
func addDesiredSets(mgr ctrl.Manager, opts Options, tracker *liveness.Tracker, out desiredsets.Publisher) error {
	sender := &desiredsets.Sender{Out: out, Agents: tracker, Log: mgr.GetLogger().WithName("desired-sets"),
		Pods: desiredsets.APINodePods{Reader: mgr.GetAPIReader(), Namespaces: opts.Namespaces}, PodChangeBatch: podChangeBatch}
	tracker.OnSession = sender.Enqueue
	pods, err := mgr.GetCache().GetInformer(context.Background(), &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("watching worker pods for the desired sets: %w", err)
	}
	if _, err := pods.AddEventHandler(sender.PodEvents()); err != nil {
		return fmt.Errorf("watching worker pods for the desired sets: %w", err)
	}
	return mgr.Add(sender)
}
