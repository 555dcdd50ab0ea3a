package jointinference

import (
	"context"
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/conditions"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// ConditionReady is true when both workers are available at the service's current generation.
const ConditionReady = "Ready"

// Reasons of the Ready condition besides the event reasons.
const (
	ReasonWorkersAvailable    = "WorkersAvailable"
	ReasonWorkersNotAvailable = "WorkersNotAvailable"
)

// workerObservation is one worker Deployment as the cache shows it, with its pods.
type workerObservation struct {
	workerType string
	deployment *appsv1.Deployment // nil when absent
	pods       []corev1.Pod
}

// writeStatus computes the status from what the pass observed and writes it when it changed. It sends the status
// at the version the pass read, refused if a newer one exists (workload.Superseded): a pass that decided
// on a stale copy never overwrites what a later pass wrote.
func (r *Reconciler) writeStatus(ctx context.Context, ji *v1alpha1.JointInferenceService, obs observation, blocked *problem, conflicts []string) error {
	status := computeStatus(ji, obs.workers, obs.views, blocked, conflicts, metav1.NewTime(obs.now))
	if metrics := edgeaware.ServiceMetrics(r.Edge.Reports(Kind, ji.Namespace, ji.Name)); metrics != nil {
		status.Metrics = v1alpha1.BoundMetrics(metrics)
	}
	if workload.Unchanged(status, ji.Status) {
		return nil
	}
	updated := &v1alpha1.JointInferenceService{ObjectMeta: workload.StatusWriteMeta(ji), Status: status}
	if err := r.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

func (r *Reconciler) observeWorker(ctx context.Context, ji *v1alpha1.JointInferenceService, workerType string) (workerObservation, error) {
	obs := workerObservation{workerType: workerType}
	d := &appsv1.Deployment{}
	// Only read (readiness, ownership): the cache's Deployment, not a copy.
	err := r.Get(ctx, types.NamespacedName{Namespace: ji.Namespace, Name: DeploymentName(ji.Name, workerType)}, d, client.UnsafeDisableDeepCopy)
	if client.IgnoreNotFound(err) != nil {
		return obs, fmt.Errorf("reading %s deployment: %w", workerType, err)
	}
	if err == nil && metav1.IsControlledBy(d, ji) {
		obs.deployment = d
	}
	if sednaTemplate(obs.deployment) {
		pods, err := r.markSednaPods(ctx, ji, workerType)
		obs.pods = pods
		return obs, err
	}
	pods := &corev1.PodList{}
	// Only read (views, commands, the status), never kept or written: copying each pod was a sixth of a pass's
	// CPU.
	if err := r.List(ctx, pods, client.InNamespace(ji.Namespace), client.MatchingFields{workloadIndex: ji.Name},
		client.MatchingLabels(contract.Labels(Kind, ji.Name, ji.UID, workerType)), client.UnsafeDisableDeepCopy); err != nil {
		return obs, fmt.Errorf("listing %s worker pods: %w", workerType, err)
	}
	obs.pods = pods.Items
	return obs, nil
}

// computeStatus is the status the service should have given what is observed; it keeps timestamps of what did
// not change, so an unchanged world writes nothing.
func computeStatus(ji *v1alpha1.JointInferenceService, workers []workerObservation, views map[string]liveness.View, blocked *problem, conflicts []string,
	now metav1.Time) v1alpha1.JointInferenceServiceStatus {
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
	case len(conflicts) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNameConflict
		cond.Message = "not owned by this service: " + strings.Join(conflicts, ", ")
	case blocked != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, blocked.reason, blocked.message
	case len(notReady) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonWorkersNotAvailable
		cond.Message = strings.Join(notReady, "; ")
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonWorkersAvailable, "both workers are available"
	}
	conditions.Set(&s.Conditions, cond, now)
	return s
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
