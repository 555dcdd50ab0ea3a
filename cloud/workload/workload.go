// Package workload holds what the JointInferenceService and FederatedLearningJob controllers are both built with,
// so that the manager builds them from one value and both read their clock and the API server past the cache the
// same way.
package workload

import (
	"time"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
)

// Deps are a workload controller's dependencies.
type Deps struct {
	client.Client
	Recorder events.EventRecorder
	// LCServer is the LC_SERVER handed to the workers that report: the node-local report endpoint.
	LCServer string
	// APIReader reads from the API server, past the cache, which holds only pods carrying Lifeline's role label:
	// the pods Sedna's GM made are found through it. Nil means the client.
	APIReader client.Reader
	// Edge is the agents' view of the edge nodes; nil means the API server's word only.
	Edge *edgeaware.Edge
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxConcurrentReconciles is how many workloads of the controller's kind are reconciled at once (never one
	// twice); zero means one.
	MaxConcurrentReconciles int
}

// Clock is the time now, by Now.
func (d *Deps) Clock() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// Uncached reads from the API server past the cache: APIReader, or the client without one.
func (d *Deps) Uncached() client.Reader {
	if d.APIReader == nil {
		return d.Client
	}
	return d.APIReader
}
