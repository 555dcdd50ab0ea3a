// Package edgeaware is what a workload controller knows of the edge: the view of each of its worker pods (the API
// server's word or the node's agent's), the commands that heal a worker on a cut-off node as its offline policy
// allows, the wake-ups of its workers' reports, the Sedna reports shaped into status, and the worker record both
// controllers keep.
package edgeaware

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/lifeline-edge/lifeline/cloud/coalesce"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Edge is what a workload controller uses of the liveness side: the views of its worker pods, the restart
// commands, and the source of its wake-ups. A nil *Edge means "API server only".
type Edge struct {
	Tracker  *liveness.Tracker
	Commands liveness.Commands
	// Nodes reads Node objects (the manager's cache).
	Nodes client.Reader
	// ReportPeriod is how long a workload's pass waits after one of its workers reported (or its Dataset was
	// counted), so the reports that arrive meanwhile cost one status write; zero: at once. A change of a
	// worker's liveness never waits.
	ReportPeriod time.Duration
}

// LivenessPriority is the work-queue priority of a pass an agent's word on a worker of a cut-off node calls for,
// or of a node whose link has just come back: above that of every other (0), so a death there, and a region's
// cut or return, is acted on ahead of the passes that creations, rollouts and reports queued.
const LivenessPriority = 10

// addFirst queues reqs ahead of the rest when q is controller-runtime's priority queue (its default), at the
// back of a plain one.
func addFirst(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs []reconcile.Request) {
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(LivenessPriority)}, reqs...)
		return
	}
	for _, r := range reqs {
		q.Add(r)
	}
}

// DefaultReportPeriod is Edge.ReportPeriod unless configured: a third of the period at which Sedna's
// joint-inference workers report (LC_PERIOD, 30 s).
const DefaultReportPeriod = 10 * time.Second

// Views returns the view of each pod by name; nil without a tracker.
func (e *Edge) Views(ctx context.Context, pods []*corev1.Pod, now time.Time) map[string]liveness.View {
	if e == nil || e.Tracker == nil {
		return nil
	}
	out := make(map[string]liveness.View, len(pods))
	ready := map[string]bool{}
	for _, p := range pods {
		if p == nil || p.Spec.NodeName == "" {
			continue
		}
		r, known := ready[p.Spec.NodeName]
		if !known {
			r = e.nodeReady(ctx, p.Spec.NodeName)
			ready[p.Spec.NodeName] = r
		}
		out[p.Name] = e.Tracker.ViewOf(p, r, now)
	}
	return out
}

func (e *Edge) nodeReady(ctx context.Context, name string) bool {
	node := &corev1.Node{}
	if err := e.Nodes.Get(ctx, client.ObjectKey{Name: name}, node, client.UnsafeDisableDeepCopy); err != nil { // only read
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Event is an Event for a workload: something an agent did to one of its workers, or a command sent to one.
type Event struct {
	Type, Reason, Message string
	// Node is the worker's node, the Event's related object: what an agent did is counted per node from it.
	Node string
}

// Event reasons, stable for alerting.
const (
	// ReasonRestartCommandSent: a worker died (or its pod was lost) on a node cut off from the API server, and
	// its agent was told to heal it.
	ReasonRestartCommandSent = "RestartCommandSent"
	// ReasonRestartedByAgent: the agent healed the worker on the controller's command.
	ReasonRestartedByAgent = "RestartedByAgent"
	// ReasonRestartedOffline: the agent healed the worker by its offline policy, cut off from the cloud.
	ReasonRestartedOffline = "RestartedOffline"
	// ReasonAgentRestartFailed: the agent refused or failed to heal the worker.
	ReasonAgentRestartFailed = "AgentRestartFailed"
)

// Act sends the commands the views call for, and returns as Events, for the workload of pods, what the agents
// reported doing to them since the last call and the commands sent now.
func (e *Edge) Act(pods []*corev1.Pod, views map[string]liveness.View, now time.Time) ([]Event, error) {
	if e == nil || e.Tracker == nil {
		return nil, nil
	}
	var events []Event
	for _, p := range pods {
		if p == nil {
			continue
		}
		for _, r := range e.Tracker.TakeActions(p.Namespace, p.Name) {
			ev := Event{Type: corev1.EventTypeNormal, Reason: ReasonRestartedByAgent, Message: fmt.Sprintf("Worker %s: %s", p.Name, r.Message),
				Node: p.Spec.NodeName}
			switch {
			case r.Outcome == lifelinev1.Outcome_OUTCOME_DUPLICATE:
				// The agent had acted on that death already (an earlier delivery, or its offline policy, whose own
				// result tells of it): nothing failed, and nothing new happened.
				continue
			case r.Outcome != lifelinev1.Outcome_OUTCOME_DONE:
				ev.Type, ev.Reason = corev1.EventTypeWarning, ReasonAgentRestartFailed
				ev.Message = fmt.Sprintf("Worker %s: %s: %s", p.Name, r.Outcome, r.Message)
			case r.Local:
				ev.Reason = ReasonRestartedOffline
			}
			events = append(events, ev)
		}
		id, err := e.Tracker.HealDead(e.Commands, p, views[p.Name], HealsOffline(p), now)
		if err != nil {
			return events, err
		}
		if id != "" {
			events = append(events, Event{Type: corev1.EventTypeNormal, Reason: ReasonRestartCommandSent,
				Message: fmt.Sprintf("Asked the agent of the cut-off node to heal worker %s (command %s)", p.Name, id), Node: p.Spec.NodeName})
		}
	}
	return events, nil
}

// HealsOffline tells whether the offline policy on a worker's pod lets its node's agent heal the worker while the
// node is cut off from the API server, and so whether the controller may command a heal then: every policy but
// None does, an absent one too, as the agent reads it [P-HEAL-1].
func HealsOffline(pod *corev1.Pod) bool {
	return pod.Annotations[lifelinev1.OfflinePolicyAnnotation] != lifelinev1.OfflinePolicyNone
}

// Source wakes a controller for the owner of every pod whose view changed (podOwner maps a worker pod, read from
// the cache, labels and all, to its workload) and for every workload of ownerKind whose workers reported. Nil
// without a tracker.
func (e *Edge) Source(pods client.Reader, podOwner handler.MapFunc, ownerKind string) source.Source {
	if e == nil || e.Tracker == nil {
		return nil
	}
	// A worker on a cut-off node is in its agent's word alone: its pass goes first, as does that of a worker
	// whose node's link has just come back, whose record goes back to the API server's word. Elsewhere the agent
	// only confirms the API server, and its pass, as a report's, only refreshes a status: it waits behind the
	// passes that make or rebuild children, which it would otherwise delay.
	toRequests := func(ctx context.Context, o client.Object) ([]reconcile.Request, bool) {
		pod := &corev1.Pod{}
		// Only read, never kept: an outage wakes every worker of a region at once, and copying each pod took a
		// tenth of the controller's CPU there.
		if err := pods.Get(ctx, client.ObjectKeyFromObject(o), pod, client.UnsafeDisableDeepCopy); err != nil {
			return nil, false
		}
		now := time.Now()
		return podOwner(ctx, pod), e.Tracker.SpeaksFor(pod.Spec.NodeName, now) || e.Tracker.Rejoined(pod.Spec.NodeName, now)
	}
	return source.Channel(e.Tracker.Subscribe(), handler.Funcs{
		GenericFunc: func(ctx context.Context, ev event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if _, isPod := ev.Object.(*corev1.Pod); isPod {
				reqs, urgent := toRequests(ctx, ev.Object)
				if urgent {
					addFirst(q, reqs)
					return
				}
				for _, r := range reqs {
					coalesce.AddRefresh(q, r, 0)
				}
				return
			}
			if ev.Object.GetObjectKind().GroupVersionKind().Kind != ownerKind {
				return
			}
			coalesce.AddRefresh(q, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(ev.Object)}, max(e.ReportPeriod, 0))
		},
	})
}

// Reports returns the latest report of each worker of a workload; nil without a tracker.
func (e *Edge) Reports(kind, namespace, name string) []liveness.Report {
	if e == nil || e.Tracker == nil {
		return nil
	}
	return e.Tracker.Reports(kind, namespace, name)
}

// DatasetSamples returns the latest count of a Dataset's samples by the agent of its node; false without a
// tracker or a count.
func (e *Edge) DatasetSamples(namespace, name string) (liveness.DatasetCount, bool) {
	if e == nil || e.Tracker == nil {
		return liveness.DatasetCount{}, false
	}
	return e.Tracker.DatasetSamples(namespace, name)
}

// RelatedNode is the object an Event of the agents' doing relates to: the worker's Node, or none.
func (e Event) RelatedNode() client.Object {
	if e.Node == "" {
		return nil
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.Node}}
}
