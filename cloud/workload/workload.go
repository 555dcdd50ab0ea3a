// Package workload holds what the JointInferenceService and FederatedLearningJob controllers are both built with,
// so that the manager builds them from one value, both read their clock and the API server past the cache the
// same way, both record their Events the same way, and both begin their controller the same way.
package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/contract/nodewatch"
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
	// Statuses writes the workloads' statuses; nil means the client (which decodes each answer).
	Statuses StatusWriter
	// Edge is the agents' view of the edge nodes; nil means the API server's word only.
	Edge *edgeaware.Edge
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Backlog, when set, counts the passes each controller has queued.
	Backlog *Backlog
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

// Eventf records an Event of a workload, as both workload controllers tell what they did: regarding is the
// workload, related the object the Event concerns (a child, a Node; nil for none), reason its stable CamelCase
// reason, action what the controller did, and note, formatted with args, what a person reads. Without a
// Recorder (a controller a unit test builds) it records nothing.
func (d *Deps) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	if d.Recorder != nil {
		d.Recorder.Eventf(regarding, related, eventType, reason, action, note, args...)
	}
}

// CreatedChild is a child a pass created, with its kind: the object the API server returned has none.
type CreatedChild struct {
	Kind   string
	Object client.Object
}

// EventCreated tells of the children one pass created in one SuccessfulCreate Event ("Created Pod a, Service
// b"), related to the child when it is one: the pass was one decision, and an Event a child would add a request
// to each child a workload's start costs the API server.
func (d *Deps) EventCreated(regarding runtime.Object, action string, created []CreatedChild) {
	if len(created) == 0 {
		return
	}
	var related runtime.Object
	if len(created) == 1 {
		related = created[0].Object
	}
	names := make([]string, len(created))
	for i, c := range created {
		names[i] = c.Kind + " " + c.Object.GetName()
	}
	slices.Sort(names)
	d.Eventf(regarding, related, corev1.EventTypeNormal, ReasonSuccessfulCreate, action, "Created %s", strings.Join(names, ", "))
}

// ReasonSuccessfulCreate is the reason of the Event that tells of a pass's creations, as the Job and ReplicaSet
// controllers name theirs.
const ReasonSuccessfulCreate = "SuccessfulCreate"

// Uncached reads from the API server past the cache: APIReader, or the client without one.
func (d *Deps) Uncached() client.Reader {
	if d.APIReader == nil {
		return d.Client
	}
	return d.APIReader
}

// NewController begins the controller of a workload kind on mgr: its worker pods indexed by workload name
// (workloadIndex, contract.IndexWorkloadPods), its passes run MaxConcurrentReconciles at once, and, edge-aware,
// it is woken by what the agents say of its workers and by the Ready condition of their nodes (nodeIndex).
// podOwner maps a worker pod to its workload. The caller adds what its kind watches and completes it.
func (d *Deps) NewController(ctx context.Context, mgr ctrl.Manager, kind, workloadIndex, nodeIndex string,
	podOwner handler.MapFunc) (*builder.Builder, error) {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, workloadIndex, contract.IndexWorkloadPods(kind)); err != nil {
		return nil, fmt.Errorf("indexing the %s worker pods: %w", kind, err)
	}
	opts := controller.Options{MaxConcurrentReconciles: d.MaxConcurrentReconciles}
	if d.Backlog != nil {
		opts.NewQueue = d.Backlog.newQueue(mgr.GetLogger())
	}
	b := ctrl.NewControllerManagedBy(mgr).WithOptions(opts)
	if edge := d.Edge.Source(mgr.GetClient(), podOwner, kind); edge != nil {
		return nodewatch.Watch(ctx, mgr, b.WatchesRawSource(edge), nodeIndex, podOwner)
	}
	return b, nil
}

// Unchanged tells whether a status computed in a pass says nothing the stored one does not, as the API server
// stores it: as JSON, with times in whole seconds. A time taken in the pass (the agent's word, a transition) keeps
// its nanoseconds, so comparing the values finds a change where writing would store the same bytes: a write, and
// a pass more woken by it, for nothing — in an outage a third of the writes.
func Unchanged(computed, stored any) bool {
	a, errA := json.Marshal(computed)
	b, errB := json.Marshal(stored)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// StatusWriteMeta is the metadata a status write sends with the status: the workload's name, UID and the version
// the pass read. The API server keeps everything but the status from the object it holds (a write to the status
// subresource changes nothing else), so the spec, a FederatedLearningJob's five pod templates, is neither
// copied nor sent, nor decoded, defaulted and tracked by the API server at every write.
func StatusWriteMeta(obj metav1.Object) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID(),
		ResourceVersion: obj.GetResourceVersion()}
}

// Superseded tells whether a status write was refused only because the workload changed since the pass read it
// (its cache behind its watch). The pass then ends without an error: the newer version is on its way to the cache
// and its arrival wakes the next pass, which decides again on it, where an error would wait out a back-off (in an
// outage, with many workloads behind, seconds each).
func Superseded(err error) bool {
	return apierrors.IsConflict(err)
}
