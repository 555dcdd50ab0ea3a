package liveness

import (
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Truth says whose word a worker's status takes.
type Truth string

// The three answers of the merge rule.
const (
	TruthAPIServer Truth = "APIServer"
	TruthAgent     Truth = "Agent"
	TruthUnknown   Truth = "Unknown"
)

// whoseTruth is the merge rule of docs/edge-awareness.md: the API server while the node reaches it; the agent
// while the agent is heard and says its node does not reach the API server; nobody when both are silent — and
// then the worker is Unknown, never taken for dead.
func whoseTruth(nodeReady, agentOnline, agentReachesAPI, agentKnowsPod bool) Truth {
	switch {
	case agentOnline && !agentReachesAPI && agentKnowsPod:
		return TruthAgent
	case agentOnline && !agentReachesAPI:
		return TruthUnknown // the agent is there but has not reported this pod: the API server's view is stale
	case agentOnline || nodeReady:
		return TruthAPIServer
	default:
		return TruthUnknown
	}
}

// freshAfterReconnect bounds how long after a node's link to the API server returns the API server's pods may
// still be what the node posted before the cut: the node posts anew only once its own daemon has noticed the link
// (edgehub retries on a cycle of about 55 s, and then edged posts) and synced. Within it, a pod the API server
// shows otherwise than the agent's latest state is taken in the agent's word.
const freshAfterReconnect = 2 * time.Minute

// agrees tells whether the API server's pod says what the agent last said of it: the same phase and at least its
// restarts. A pod that does not has not been posted by the node since; the agent's word is the newer.
func agrees(pod *corev1.Pod, s *lifelinev1.WorkerState) bool {
	var restarts int32
	for _, c := range pod.Status.ContainerStatuses {
		restarts += c.RestartCount
	}
	return string(pod.Status.Phase) == s.Phase.PodPhase() && restarts >= s.Restarts
}

// View is what Lifeline believes of one worker pod.
type View struct {
	Truth Truth
	// State is the agent's latest state of the pod, when the agent is the truth.
	State *lifelinev1.WorkerState
	// SeenAt is when the controller accepted State.
	SeenAt time.Time
}

// ViewOf merges the table with the API server's word on pod; nodeReady is the Ready condition of the pod's Node.
func (t *Tracker) ViewOf(pod *corev1.Pod, nodeReady bool, now time.Time) View {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[pod.Spec.NodeName]
	online := t.isOnline(n, now)
	var w *workerRecord
	if n != nil {
		w = n.workers[podRef{pod.Namespace, pod.Name}]
	}
	knows := w != nil && w.state.Uid == string(pod.UID)
	v := View{Truth: whoseTruth(nodeReady, online, online && n.apiReachable, knows)}
	if v.Truth == TruthAPIServer && knows && online && now.Sub(n.apiBackAt) < freshAfterReconnect && !agrees(pod, w.state) {
		v.Truth = TruthAgent // the link is back, but the node has not posted this pod since
	}
	if v.Truth == TruthAgent {
		v.State, v.SeenAt = proto.Clone(w.state).(*lifelinev1.WorkerState), w.at
	}
	return v
}

// Rejoined tells whether node's link to the API server came back lately (within freshAfterReconnect), its agent
// heard: its workers are going back to the API server's word, a change of whose word as urgent as the cut.
func (t *Tracker) Rejoined(node string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[node]
	return t.isOnline(n, now) && n.apiReachable && !n.apiBackAt.IsZero() && now.Sub(n.apiBackAt) < freshAfterReconnect
}

// SpeaksFor tells whether the agent of node is the truth for its workers now: heard, and cut off from the API
// server.
func (t *Tracker) SpeaksFor(node string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[node]
	return t.isOnline(n, now) && !n.apiReachable
}
