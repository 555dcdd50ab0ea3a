// Package workerstatus fills the per-worker status records (status.workers[]) that both controllers keep, from
// what the API server reports of a worker pod.
package workerstatus

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// FromPod sets the fields a pod tells: node, phase, readiness, restarts of its containers, liveness, source, and
// last seen (its latest condition transition). The record's identity, failures and message are left alone.
func FromPod(ws *v1alpha1.WorkerStatus, p *corev1.Pod) {
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

// Transitioned keeps old's transition time while phase and liveness stay the same, and sets now otherwise, so an
// unchanged worker writes nothing.
func Transitioned(ws *v1alpha1.WorkerStatus, old v1alpha1.WorkerStatus, now metav1.Time) {
	if old.LastTransitionTime != nil && old.Phase == ws.Phase && old.Liveness == ws.Liveness {
		ws.LastTransitionTime = old.LastTransitionTime
		return
	}
	ws.LastTransitionTime = &now
}
