// Package manager builds Lifeline's controller manager: the scheme, the cache, and every controller, so the
// binary and the integration tests run the same wiring.
package manager

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// Options configure the manager.
type Options struct {
	// LeaderElection makes replicas elect one active controller; LeaderElectionNamespace is where the Lease is.
	LeaderElection          bool
	LeaderElectionNamespace string
	// MetricsAddr serves Prometheus metrics ("0" disables); HealthAddr serves /healthz and /readyz ("0" disables).
	MetricsAddr, HealthAddr string
	// LCServer is the LC_SERVER handed to edge workers.
	LCServer string
	// MQTTAddress, when set, runs the embedded MQTT broker there (e.g. ":1883") and makes the controllers
	// edge-aware: they merge the agents' reports and send them restart commands.
	MQTTAddress string
	// MQTTTLS, when set, makes the broker's listener TLS.
	MQTTTLS *tls.Config
	// MQTTCredentialsDir holds one password file per node (a mounted Secret).
	MQTTCredentialsDir string
	// Cluster is this cluster's name in the MQTT topic tree.
	Cluster string
	// Restartable lets one process build the manager more than once (controller names are otherwise unique
	// per process), for tests that stop and start the controller.
	Restartable bool
}

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

// New builds the manager with every controller registered.
func New(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	if opts.LCServer == "" {
		opts.LCServer = contract.DefaultLCServer
	}
	// Only worker pods are cached: a cluster's other pods are none of Lifeline's business.
	workerPods, err := labels.NewRequirement(contract.RoleLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "lifeline-controller.sedna.io",
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsAddr},
		HealthProbeBindAddress:  opts.HealthAddr,
		Controller:              config.Controller{SkipNameValidation: ptr.To(opts.Restartable)},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*workerPods)},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	edge, err := addEdge(mgr, opts)
	if err != nil {
		return nil, err
	}
	ji := &jointinference.Reconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("lifeline-controller"),
		LCServer: opts.LCServer,
		Edge:     edge,
	}
	if err := ji.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the JointInferenceService controller: %w", err)
	}
	fl := &federatedlearning.Reconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("lifeline-controller"),
		LCServer: opts.LCServer,
		Edge:     edge,
	}
	if err := fl.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the FederatedLearningJob controller: %w", err)
	}
	return mgr, nil
}

// addEdge adds the liveness tracker and the embedded broker to the manager; nil without an MQTT address.
func addEdge(mgr ctrl.Manager, opts Options) (*liveness.Edge, error) {
	if opts.MQTTAddress == "" {
		return nil, nil
	}
	if opts.Cluster == "" {
		opts.Cluster = "default"
	}
	log := mgr.GetLogger().WithName("liveness")
	tracker, err := liveness.NewTracker(opts.Cluster, metrics.Registry, log)
	if err != nil {
		return nil, err
	}
	pods := mgr.GetClient()
	tracker.PodNode = func(namespace, name string) (string, bool) {
		pod := &corev1.Pod{}
		if err := pods.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
			return "", false
		}
		return pod.Spec.NodeName, pod.Spec.NodeName != ""
	}
	b := &brokerRunnable{cfg: broker.Config{Address: opts.MQTTAddress, Cluster: opts.Cluster,
		CredentialsDir: opts.MQTTCredentialsDir, TLS: opts.MQTTTLS, Tracker: tracker}}
	if err := mgr.Add(b); err != nil {
		return nil, err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { tracker.Run(ctx); return nil })); err != nil {
		return nil, err
	}
	return &liveness.Edge{Tracker: tracker, Commands: b, Nodes: mgr.GetClient()}, nil
}

// brokerRunnable runs the embedded broker for as long as the manager runs (on the elected leader only).
type brokerRunnable struct {
	cfg     broker.Config
	running atomic.Pointer[broker.Broker]
}

func (b *brokerRunnable) Start(ctx context.Context) error {
	br, err := broker.Start(b.cfg)
	if err != nil {
		return err
	}
	b.running.Store(br)
	<-ctx.Done()
	b.running.Store(nil)
	return br.Close()
}

func (b *brokerRunnable) PublishCommand(node string, payload []byte) error {
	br := b.running.Load()
	if br == nil {
		return fmt.Errorf("the MQTT broker is not running")
	}
	return br.PublishCommand(node, payload)
}
