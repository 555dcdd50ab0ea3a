package edgeaware

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Record is a worker's record as its pod and the view of its node's agent make it. rec brings what a pod cannot
// tell (the identity, failures, the counted pod, the message) and is returned with the rest set; old is the
// record as stored, whose transition time is kept while phase and liveness stay the same, so that an unchanged
// worker writes nothing.
func Record(rec v1alpha1.WorkerStatus, pod *corev1.Pod, view liveness.View, old v1alpha1.WorkerStatus, now metav1.Time) v1alpha1.WorkerStatus {
	fromPod(&rec, pod)
	applyView(&rec, view)
	Transitioned(&rec, old, now)
	return rec
}

// fromPod sets the fields a pod tells: node, phase, readiness, restarts of its containers, liveness, source, and
// last seen (its latest condition transition).
func fromPod(ws *v1alpha1.WorkerStatus, p *corev1.Pod) {
	ws.Node = p.Spec.NodeName
	ws.Phase = string(p.Status.Phase)
	ws.Source = v1alpha1.StatusSourceAPIServer
	ws.Ready, ws.LastSeen, ws.Restarts = false, nil, 0
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ws.Ready = c.Status == corev1.ConditionTrue
		}
		if ws.LastSeen == nil || c.LastTransitionTime.After(ws.LastSeen.Time) {
			t := c.LastTransitionTime
			ws.LastSeen = &t
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		ws.Restarts += c.RestartCount
	}
	switch p.Status.Phase {
	case corev1.PodRunning:
		ws.Liveness = v1alpha1.LivenessAlive
	case corev1.PodSucceeded, corev1.PodFailed:
		ws.Liveness = v1alpha1.LivenessDead
	default:
		ws.Liveness = v1alpha1.LivenessUnknown
	}
}

// applyView sets what the view decides: under the agent's truth, liveness, phase, readiness, restarts and last
// seen come from the agent; under no one's, the worker's liveness is unknown.
func applyView(ws *v1alpha1.WorkerStatus, v liveness.View) {
	switch v.Truth {
	case liveness.TruthUnknown:
		ws.Liveness, ws.Source, ws.Ready = v1alpha1.LivenessUnknown, v1alpha1.StatusSourceNone, false
	case liveness.TruthAgent:
		s := v.State
		ws.Source = v1alpha1.StatusSourceAgent
		ws.Phase = s.Phase.PodPhase()
		ws.Ready = s.Phase == lifelinev1.Phase_PHASE_RUNNING
		ws.Restarts = max(ws.Restarts, s.Restarts)
		seen := metav1.NewTime(v.SeenAt)
		ws.LastSeen = &seen
		switch s.Phase {
		case lifelinev1.Phase_PHASE_RUNNING:
			ws.Liveness = v1alpha1.LivenessAlive
		case lifelinev1.Phase_PHASE_FAILED, lifelinev1.Phase_PHASE_GONE, lifelinev1.Phase_PHASE_SUCCEEDED:
			ws.Liveness = v1alpha1.LivenessDead
		default:
			ws.Liveness = v1alpha1.LivenessUnknown
		}
	}
}

// Transitioned keeps old's transition time while phase and liveness stay the same, and sets now otherwise. A
// record without a pod goes through it alone.
func Transitioned(ws *v1alpha1.WorkerStatus, old v1alpha1.WorkerStatus, now metav1.Time) {
	if old.LastTransitionTime != nil && old.Phase == ws.Phase && old.Liveness == ws.Liveness {
		ws.LastTransitionTime = old.LastTransitionTime
		return
	}
	ws.LastTransitionTime = &now
}
