package v1alpha1

import (
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// ModelRef names a Model in the same namespace.
type ModelRef struct {
	// Name of the Model.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// DatasetRef names a Dataset in the same namespace.
type DatasetRef struct {
	// Name of the Dataset.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ParaSpec is one key/value parameter, as Sedna passes them to workers.
type ParaSpec struct {
	// +kubebuilder:validation:MaxLength=256
	Key string `json:"key"`
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value"`
}

// Metric is one key/value measurement reported by a worker.
type Metric struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Bounds of what the controllers copy from workers' reports and pods into a status. Workers choose their report
// keys and values, and a status that grows past what the API server stores can no longer be written.
const (
	// MaxStatusMetrics is how many metrics a status keeps (status.metrics, status.progress.metrics).
	MaxStatusMetrics = 64
	// MaxMetricKeyLength is the longest metric key kept; a longer key is no measurement, and is dropped.
	MaxMetricKeyLength = 128
	// MaxMetricValueLength is the longest metric value kept; a longer one is cut to this many bytes.
	MaxMetricValueLength = 256
	// MaxStatusWorkers is how many worker records a JointInferenceService's status keeps (status.workers).
	MaxStatusWorkers = 256
)

// BoundMetrics keeps of metrics (sorted by key) at most MaxStatusMetrics, the first by key, dropping those whose
// key is empty or longer than MaxMetricKeyLength and cutting values to MaxMetricValueLength bytes (on a UTF-8
// character boundary).
func BoundMetrics(metrics []Metric) []Metric {
	var out []Metric
	for _, m := range metrics {
		if len(out) == MaxStatusMetrics {
			break
		}
		if m.Key == "" || len(m.Key) > MaxMetricKeyLength {
			continue
		}
		if len(m.Value) > MaxMetricValueLength {
			cut := MaxMetricValueLength
			for cut > 0 && !utf8.RuneStart(m.Value[cut]) {
				cut--
			}
			m.Value = m.Value[:cut]
		}
		out = append(out, m)
	}
	return out
}

// OfflineAction is what the edge agent does for a dead worker while its node cannot reach the API server.
// +kubebuilder:validation:Enum=Restart;None
type OfflineAction string

const (
	// OfflineActionRestart restarts the worker on its node (the default).
	OfflineActionRestart OfflineAction = lifelinev1.OfflinePolicyRestart
	// OfflineActionNone only reports the worker's state; nothing is restarted until the API server is back.
	OfflineActionNone OfflineAction = lifelinev1.OfflinePolicyNone
)

// OfflinePolicy tells the edge agent how to heal a worker while the node is cut off from the API server.
// Lifeline addition; absent means Restart.
type OfflinePolicy struct {
	// Action for a worker that died and will not come back by itself.
	// +kubebuilder:default=Restart
	// +optional
	Action OfflineAction `json:"action,omitempty"`
}

// WorkerRole is the part a worker plays in its workload.
// +kubebuilder:validation:Enum=edge;cloud;aggregator;trainer
type WorkerRole string

// Worker roles.
const (
	WorkerRoleEdge       WorkerRole = "edge"
	WorkerRoleCloud      WorkerRole = "cloud"
	WorkerRoleAggregator WorkerRole = "aggregator"
	WorkerRoleTrainer    WorkerRole = "trainer"
)

// Liveness says whether a worker is known to be running.
// +kubebuilder:validation:Enum=Alive;Dead;Unknown
type Liveness string

// Liveness values. Unknown means nobody can see the worker (node and agent silent); it is never taken for Dead.
const (
	LivenessAlive   Liveness = "Alive"
	LivenessDead    Liveness = "Dead"
	LivenessUnknown Liveness = "Unknown"
)

// StatusSource says where a worker's state came from.
// +kubebuilder:validation:Enum=apiserver;agent;none
type StatusSource string

// Status sources: the API server while the node reaches it, the edge agent while only the agent does.
const (
	StatusSourceAPIServer StatusSource = "apiserver"
	StatusSourceAgent     StatusSource = "agent"
	StatusSourceNone      StatusSource = "none"
)

// WorkerStatus is Lifeline's view of one worker pod. Lifeline addition.
type WorkerStatus struct {
	// Name is the worker's identity: its pod name, which is also its WORKER_NAME for FL workers.
	Name string `json:"name"`
	// Role of the worker.
	Role WorkerRole `json:"role"`
	// Node the worker is bound to.
	// +optional
	Node string `json:"node,omitempty"`
	// Phase of the worker's pod (Pending, Running, Succeeded, Failed, Unknown).
	// +optional
	Phase string `json:"phase,omitempty"`
	// Ready is true when every container of the worker is ready.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// Restarts counts container restarts of the current pod.
	// +optional
	Restarts int32 `json:"restarts,omitempty"`
	// Failures counts this identity's failures charged to the retry budgets: failed pods (not those ended by a
	// disruption such as eviction or node loss) and the container restarts of earlier pods.
	// +optional
	Failures int32 `json:"failures,omitempty"`
	// LastFailureTime is when the latest charged failure was counted; the retry backoff runs from it.
	// +optional
	LastFailureTime *metav1.Time `json:"lastFailureTime,omitempty"`
	// CountedPodUID is the last pod of this identity whose end has been counted. The controller counts a pod's
	// end once, and lets the pod go (removes its finalizer) only after this record is stored.
	// +optional
	CountedPodUID types.UID `json:"countedPodUID,omitempty"`
	// Liveness as last observed.
	// +optional
	Liveness Liveness `json:"liveness,omitempty"`
	// Source of this entry.
	// +optional
	Source StatusSource `json:"source,omitempty"`
	// LastSeen is when the source last reported the worker.
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`
	// LastTransitionTime is when Phase or Liveness last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// Message is a human-readable detail, e.g. the last exit reason.
	// +optional
	Message string `json:"message,omitempty"`
}
