package v1alpha1

import (
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JointInferenceService runs a small model on an edge node that sends hard examples to a big model in the cloud.
// Its name is at most 53 characters: it is part of its workers' label values (at most 63).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ji
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Edge",type=string,JSONPath=`.status.edgeReady`,description="ready/desired edge workers"
// +kubebuilder:printcolumn:name="Cloud",type=string,JSONPath=`.status.cloudReady`,description="ready/desired cloud workers"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type JointInferenceService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   JointInferenceServiceSpec   `json:"spec"`
	Status JointInferenceServiceStatus `json:"status,omitempty"`
}

// JointInferenceServiceSpec describes the two workers. Every field may be edited; edits roll the workers.
type JointInferenceServiceSpec struct {
	EdgeWorker  EdgeWorker  `json:"edgeWorker"`
	CloudWorker CloudWorker `json:"cloudWorker"`
}

// EdgeWorker is the small-model worker pinned to an edge node.
type EdgeWorker struct {
	Model             ModelRef          `json:"model"`
	HardExampleMining HardExampleMining `json:"hardExampleMining"`
	// Template of the worker's pods: a spec that lists at least one container.
	Template corev1.PodTemplateSpec `json:"template"`
	// HPA scales the edge worker's Deployment when set.
	// +optional
	HPA *HPA `json:"hpa,omitempty"`

	// Strategy replaces the edge Deployment's pods on an update. Lifeline addition; absent means RollingUpdate
	// with maxSurge 0 and maxUnavailable 1, so a single pinned device never has to hold two copies.
	// +optional
	Strategy *appsv1.DeploymentStrategy `json:"strategy,omitempty"`
	// OfflinePolicy tells the edge agent how to heal the worker while its node is cut off from the API server.
	// Lifeline addition; absent means Restart.
	// +optional
	OfflinePolicy *OfflinePolicy `json:"offlinePolicy,omitempty"`
}

// CloudWorker is the big-model worker behind the `<name>-cloud` Service.
type CloudWorker struct {
	Model ModelRef `json:"model"`
	// Template of the worker's pods: a spec that lists at least one container.
	Template corev1.PodTemplateSpec `json:"template"`
	// HPA scales the cloud worker's Deployment when set.
	// +optional
	HPA *HPA `json:"hpa,omitempty"`
}

// HardExampleMining names the algorithm that picks the examples sent to the cloud, and its parameters.
type HardExampleMining struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Parameters []ParaSpec `json:"parameters,omitempty"`
}

// HPA is a HorizontalPodAutoscaler for one worker's Deployment.
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.maxReplicas >= self.minReplicas",message="must be greater than or equal to minReplicas",fieldPath=".maxReplicas"
type HPA struct {
	// MinReplicas is handed to the HPA as it is: 0 (scale to zero) is for the API server to accept, which it
	// does only with the HPAScaleToZero feature gate and an Object or External metric.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// +kubebuilder:validation:Minimum=1
	MaxReplicas int32 `json:"maxReplicas"`
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Metrics []autoscalingv2.MetricSpec `json:"metrics,omitempty"`
	// +optional
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
}

// JointInferenceServiceStatus is what the controller last observed.
type JointInferenceServiceStatus struct {
	// Conditions: Ready (both workers available).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec this status describes. Lifeline addition.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// StartTime is when the controller first acted on the service.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// Active counts running worker pods.
	// +optional
	Active int32 `json:"active"`
	// Failed counts worker pods that are not running.
	// +optional
	Failed int32 `json:"failed"`
	// Metrics reported by the edge worker (inference counts, hard examples, upload ratio).
	// +optional
	Metrics []Metric `json:"metrics,omitempty"`
	// EdgeReady and CloudReady read "ready/desired" for each worker's Deployment. Lifeline addition.
	// +optional
	EdgeReady string `json:"edgeReady,omitempty"`
	// +optional
	CloudReady string `json:"cloudReady,omitempty"`
	// Workers has one entry per worker pod. Lifeline addition.
	// The controller alone writes it, whole, so it is atomic: as a map the API server would track each field of
	// each worker in the object's managed fields, on every write.
	// +listType=atomic
	// +optional
	Workers []WorkerStatus `json:"workers,omitempty"`
}

// JointInferenceServiceList is a list of JointInferenceService.
//
// +kubebuilder:object:root=true
type JointInferenceServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []JointInferenceService `json:"items"`
}
