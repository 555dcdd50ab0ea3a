package manager

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/internal/lograte"
)

// openSession connects to the external broker, or starts the embedded one.
func openSession(ctx context.Context, mgr ctrl.Manager, opts Options, tracker *liveness.Tracker) (session, error) {
	if opts.MQTTBrokerURL != "" {
		return broker.Connect(broker.ExternalConfig{URL: opts.MQTTBrokerURL, Username: opts.MQTTUsername,
			Password: opts.MQTTPassword, TLS: opts.MQTTTLS, Cluster: opts.Cluster, Tracker: tracker})
	}
	// Nodes are read from the manager's cache: a CONNECT costs no request to the API server. The broker
	// starts once that cache holds the Nodes, with the watch that ends a gone Node's session in place.
	nodes, err := mgr.GetCache().GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return nil, fmt.Errorf("watching nodes for the broker: %w", err)
	}
	b, err := broker.Start(broker.Config{Address: opts.MQTTAddress, Cluster: opts.Cluster,
		CredentialsDir: opts.MQTTCredentialsDir, TLS: opts.MQTTTLS, Limits: opts.MQTTLimits, Tracker: tracker,
		ClientCerts: broker.ClientCerts{CAs: opts.MQTTClientCAs, RevokedFile: opts.MQTTRevokedCertificatesFile},
		Nodes:       broker.CacheNodes{Reader: mgr.GetClient()}, Clock: opts.Clock})
	if err != nil {
		return nil, err
	}
	closer, err := endSessionsOfGoneNodes(nodes, func(node string) {
		b.CloseNode(node) // first: the agent, let in again should its Node come back, announces itself anew
		tracker.ForgetNode(node)
	})
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return &embedded{Broker: b, closeWatch: closer}, nil
}

// session is where the controller hears the agents and sends them commands.
type session interface {
	PublishCommand(node string, payload []byte) error
	PublishDesired(node string, payload []byte) error
	Close() error
}

// embedded is the embedded broker with the watch that ends the sessions of Nodes that go.
type embedded struct {
	*broker.Broker
	closeWatch func()
}

func (e *embedded) Close() error {
	e.closeWatch()
	return e.Broker.Close()
}

// endSessionsOfGoneNodes calls end with a node's name when its Node is deleted or loses the edge label: the
// embedded broker ends the node's session at once rather than at its next recheck, and the liveness table
// forgets the node. It returns what stops it.
func endSessionsOfGoneNodes(informer cache.Informer, end func(node string)) (func(), error) {
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if node, ok := obj.(*corev1.Node); ok {
				end(node.Name)
			}
		},
		UpdateFunc: func(_, obj any) {
			if node, ok := obj.(*corev1.Node); ok && !broker.IsEdgeNode(node) {
				end(node.Name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching nodes for the broker: %w", err)
	}
	return func() { _ = informer.RemoveEventHandler(reg) }, nil
}

// sessionRunnable holds the broker session for as long as the manager runs, on the elected leader only: one
// controller hears the agents and commands them. A session that cannot be opened (an external broker out of
// reach, the listener's address taken) is tried again, with a growing wait, until the manager stops: the agents
// journal what they cannot send meanwhile, and readiness says the broker is not up.
type sessionRunnable struct {
	open func(context.Context) (session, error)
	// external: the session is with an external broker at address (else the embedded broker listens there).
	external bool
	address  string
	log      logr.Logger

	mu      sync.Mutex
	running session
}

// Session retries: the first wait, and the longest.
const (
	sessionRetryMin = time.Second
	sessionRetryMax = 30 * time.Second
)

func (r *sessionRunnable) Start(ctx context.Context) error {
	var (
		s       session
		err     error
		wait    = sessionRetryMin
		told    lograte.Schedule
		failing bool
	)
	for {
		if s, err = r.open(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		failing = true
		if told.Due(time.Now()) {
			if r.external {
				r.log.Error(err, "cannot connect to the external MQTT broker; retrying", "broker", r.address)
			} else {
				r.log.Error(err, "cannot start the embedded MQTT broker; retrying", "address", r.address)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, sessionRetryMax)
	}
	if failing {
		r.log.Info("MQTT broker session up", "address", r.address)
	}
	r.mu.Lock()
	r.running = s
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.running = nil
	r.mu.Unlock()
	return s.Close()
}

// embeddedBroker is the embedded broker while it runs, nil otherwise.
func (r *sessionRunnable) embeddedBroker() *broker.Broker {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.running.(*embedded); ok {
		return e.Broker
	}
	return nil
}

// up tells whether the session is open: the embedded broker listens, or the external broker took the session.
func (r *sessionRunnable) up() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running != nil
}

func (r *sessionRunnable) PublishCommand(node string, payload []byte) error {
	s, err := r.current()
	if err != nil {
		return err
	}
	return s.PublishCommand(node, payload)
}

func (r *sessionRunnable) PublishDesired(node string, payload []byte) error {
	s, err := r.current()
	if err != nil {
		return err
	}
	return s.PublishDesired(node, payload)
}

func (r *sessionRunnable) current() (session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		return nil, fmt.Errorf("no MQTT session: this replica is not the leader, or its broker is not up yet")
	}
	return r.running, nil
}
