// Package manager builds Lifeline's controller manager: the scheme, the cache, and every controller, so the
// binary and the integration tests run the same wiring.
package manager

import (
	"fmt"

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
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
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
	ji := &jointinference.Reconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("lifeline-controller"),
		LCServer: opts.LCServer,
	}
	if err := ji.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the JointInferenceService controller: %w", err)
	}
	fl := &federatedlearning.Reconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("lifeline-controller"),
		LCServer: opts.LCServer,
	}
	if err := fl.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the FederatedLearningJob controller: %w", err)
	}
	return mgr, nil
}
