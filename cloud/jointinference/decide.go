package jointinference

import (
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// plan is what one pass decides, computed without I/O from what it observed: the children the service should
// own, and its status. The Ready condition is held apart from the status, in ready: the act step can find a
// child under the service's names that someone else owns, which outranks it (statusAfter).
type plan struct {
	children desiredChildren
	status   v1alpha1.JointInferenceServiceStatus // all but the Ready condition
	ready    metav1.Condition
}

// desiredChildren is what a service should own. A nil HPA means none should exist under that name.
type desiredChildren struct {
	deployments []*appsv1.Deployment
	service     *corev1.Service
	hpas        map[string]*autoscalingv2.HorizontalPodAutoscaler
}

// decide renders the children the service should own, or, when its inputs are missing or its spec cannot be
// rendered, only its Service, with the problem its status tells; and computes the status from the workers.
func decide(obs observation) plan {
	p := plan{children: desiredChildren{service: renderCloudService(obs.in.ji)}}
	blocked := obs.missing
	if blocked == nil {
		want, err := render(obs.in)
		if err != nil {
			blocked = &problem{reason: ReasonInvalidSpec, message: err.Error()}
		} else {
			p.children = want
		}
	}
	p.status, p.ready = computeStatus(obs.in.ji, obs.workers, obs.views, blocked, metav1.NewTime(obs.now))
	return p
}

func render(in inputs) (desiredChildren, error) {
	cloud, err := renderCloudDeployment(in)
	if err != nil {
		return desiredChildren{}, fmt.Errorf("cloud worker: %w", err)
	}
	edge, err := renderEdgeDeployment(in)
	if err != nil {
		return desiredChildren{}, fmt.Errorf("edge worker: %w", err)
	}
	ji := in.ji
	return desiredChildren{
		deployments: []*appsv1.Deployment{cloud, edge},
		service:     renderCloudService(ji),
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{
			HPAName(cloud.Name): renderHPA(ji, workerCloud, ji.Spec.CloudWorker.HPA),
			HPAName(edge.Name):  renderHPA(ji, workerEdge, ji.Spec.EdgeWorker.HPA),
		},
	}, nil
}

// computeStatus is the status the service should have given what is observed, but for its Ready condition,
// returned apart; it keeps timestamps of what did not change, so an unchanged world writes nothing.
func computeStatus(ji *v1alpha1.JointInferenceService, workers []workerObservation, views map[string]liveness.View, blocked *problem,
	now metav1.Time) (v1alpha1.JointInferenceServiceStatus, metav1.Condition) {
	s := *ji.Status.DeepCopy()
	// Sedna's GM wrote Pending, Running and Failed conditions, appended without a reason; Ready replaces them,
	// and what is kept is made valid under Lifeline's schema so the status can be written back.
	s.Conditions, _ = conditions.Normalize(s.Conditions, func(t string) bool { return t == ConditionReady }, now)
	s.ObservedGeneration = ji.Generation
	if s.StartTime == nil {
		s.StartTime = &now
	}

	var active, desired int32
	var notReady []string
	previous := map[string]v1alpha1.WorkerStatus{}
	for _, w := range ji.Status.Workers {
		previous[w.Name] = w
	}
	s.Workers = nil
	for _, w := range workers {
		ready, want := deploymentReadiness(w.deployment)
		readiness := fmt.Sprintf("%d/%d", ready, want)
		if w.workerType == workerEdge {
			s.EdgeReady = readiness
		} else {
			s.CloudReady = readiness
		}
		desired += want
		if !deploymentAvailable(w.deployment) {
			notReady = append(notReady, fmt.Sprintf("%s worker %s ready", w.workerType, readiness))
		}
		for i := range w.pods {
			ws := podWorkerStatus(&w.pods[i], roleOf(w.workerType), previous, views[w.pods[i].Name], now)
			if ws.Phase == string(corev1.PodRunning) {
				active++
			}
			s.Workers = append(s.Workers, ws)
		}
	}
	s.Workers = boundWorkers(s.Workers)
	s.Active = active
	s.Failed = max(desired-active, 0)

	cond := metav1.Condition{Type: ConditionReady, ObservedGeneration: ji.Generation}
	switch {
	case blocked != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, blocked.reason, blocked.message
	case len(notReady) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonWorkersNotAvailable
		cond.Message = strings.Join(notReady, "; ")
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonWorkersAvailable, "both workers are available"
	}
	return s, cond
}

// boundWorkers sorts the worker records by name and keeps at most MaxStatusWorkers of them (a rollout of a large
// HPA can show more pods), those that need attention — not alive and ready — first: active and failed still
// count every pod.
func boundWorkers(ws []v1alpha1.WorkerStatus) []v1alpha1.WorkerStatus {
	sort.Slice(ws, func(i, j int) bool { return ws[i].Name < ws[j].Name })
	if len(ws) <= v1alpha1.MaxStatusWorkers {
		return ws
	}
	healthy := func(w v1alpha1.WorkerStatus) bool { return w.Liveness == v1alpha1.LivenessAlive && w.Ready }
	sort.SliceStable(ws, func(i, j int) bool { return !healthy(ws[i]) && healthy(ws[j]) })
	ws = ws[:v1alpha1.MaxStatusWorkers]
	sort.Slice(ws, func(i, j int) bool { return ws[i].Name < ws[j].Name })
	return ws
}

// deploymentReadiness is (ready pods, desired pods).
func deploymentReadiness(d *appsv1.Deployment) (int32, int32) {
	if d == nil {
		return 0, 1
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return d.Status.ReadyReplicas, want
}

// deploymentAvailable is true when the Deployment controller has seen the latest spec, rolled it out to every
// replica, and they are available.
func deploymentAvailable(d *appsv1.Deployment) bool {
	if d == nil || d.Status.ObservedGeneration < d.Generation {
		return false
	}
	_, want := deploymentReadiness(d)
	return d.Status.UpdatedReplicas >= want && d.Status.AvailableReplicas >= want && d.Status.Replicas == d.Status.UpdatedReplicas
}

func roleOf(workerType string) v1alpha1.WorkerRole {
	if workerType == workerEdge {
		return v1alpha1.WorkerRoleEdge
	}
	return v1alpha1.WorkerRoleCloud
}

// podWorkerStatus is the status entry of one worker pod as the API server reports it, merged with what the
// node's agent says when the view makes the agent the truth.
func podWorkerStatus(p *corev1.Pod, role v1alpha1.WorkerRole, previous map[string]v1alpha1.WorkerStatus, view liveness.View, now metav1.Time) v1alpha1.WorkerStatus {
	ws := v1alpha1.WorkerStatus{Name: p.Name, Role: role}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated != nil {
			ws.Message = fmt.Sprintf("container %s exited %d (%s)", c.Name, c.State.Terminated.ExitCode, c.State.Terminated.Reason)
		}
	}
	return edgeaware.Record(ws, p, view, previous[p.Name], now)
}
