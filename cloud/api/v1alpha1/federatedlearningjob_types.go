package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FederatedLearningJob trains one model across edge nodes without moving their data: an aggregator in the cloud
// and one trainer on each node that holds a Dataset. Like a batch Job it runs once; its workers are fixed at
// creation (only spec.runPolicy may change).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fl
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Round",type=integer,JSONPath=`.status.progress.round`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.active`
// +kubebuilder:printcolumn:name="Succeeded",type=integer,JSONPath=`.status.succeeded`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.failed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FederatedLearningJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FederatedLearningJobSpec   `json:"spec"`
	Status FederatedLearningJobStatus `json:"status,omitempty"`
}

// FederatedLearningJobSpec describes the workers of a job. Everything but RunPolicy is immutable, by the chart's
// admission policy lifeline-fl-immutable-workers, not by rules of this schema, which the API server would evaluate
// on every status write too.
type FederatedLearningJobSpec struct {
	// AggregationWorker runs in the cloud behind the `<name>-aggregation` Service.
	AggregationWorker AggregationWorker `json:"aggregationWorker"`
	// TrainingWorkers each run on the node of their Dataset.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=128
	TrainingWorkers []TrainingWorker `json:"trainingWorkers"`
	// PretrainedModel is handed to every worker as PRETRAINED_MODEL_URL.
	// +optional
	PretrainedModel *PretrainedModel `json:"pretrainedModel,omitempty"`
	// Transmitter is how workers exchange parameters; absent means websocket.
	// +optional
	Transmitter *Transmitter `json:"transmitter,omitempty"`

	// RunPolicy bounds retries, run time and lifetime. Lifeline addition; every field is defaulted and mutable.
	// +optional
	RunPolicy *RunPolicy `json:"runPolicy,omitempty"`
}

// AggregationWorker is the job's aggregator.
type AggregationWorker struct {
	Model ModelRef `json:"model"`
	// Template of the aggregator's pods: a spec that lists at least one container.
	Template corev1.PodTemplateSpec `json:"template"`
}

// TrainingWorker is one trainer and the Dataset it learns from.
type TrainingWorker struct {
	Dataset DatasetRef `json:"dataset"`
	// Template of the trainer's pods: a spec that lists at least one container.
	Template corev1.PodTemplateSpec `json:"template"`
}

// PretrainedModel names the Model the workers start from. An empty name means none: Go clients built on Sedna's
// types, where the field is a struct, always send it, as {name: ""} when unset.
type PretrainedModel struct {
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// Transmitter selects how model updates travel between trainers and aggregator.
type Transmitter struct {
	// +optional
	S3 *S3Transmitter `json:"s3,omitempty"`
	// +optional
	WS *WSTransmitter `json:"ws,omitempty"`
}

// S3Transmitter passes updates through an object store.
type S3Transmitter struct {
	// +kubebuilder:validation:MinLength=1
	AggDataPath string `json:"aggDataPath"`
	// +optional
	CredentialName string `json:"credentialName,omitempty"`
}

// WSTransmitter passes updates over websockets to the aggregator (Sedna's default).
type WSTransmitter struct{}

// TrainerCompletionPolicy is what happens to trainers still running when the aggregator succeeds.
// +kubebuilder:validation:Enum=Stop;Wait
type TrainerCompletionPolicy string

const (
	// TrainersStop deletes trainer pods still running once the job is Complete (the default).
	TrainersStop TrainerCompletionPolicy = "Stop"
	// TrainersWait leaves them to finish by themselves; they are never re-run.
	TrainersWait TrainerCompletionPolicy = "Wait"
)

// RunPolicy is the Job-like part of a FederatedLearningJob. Lifeline addition.
type RunPolicy struct {
	// BackoffLimit is how many worker pod failures the whole job tolerates before it is Failed.
	// Failures caused by disruption (eviction, preemption, node loss) do not count.
	// +kubebuilder:default=6
	// +kubebuilder:validation:Minimum=0
	// +optional
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`
	// BackoffLimitPerWorker is how many failures one worker identity tolerates before the job is Failed.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +optional
	BackoffLimitPerWorker *int32 `json:"backoffLimitPerWorker,omitempty"`
	// BackoffSeconds is the delay before a failed worker is re-created the first time; it doubles with each
	// further failure of that worker, up to MaxBackoffSeconds.
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +optional
	BackoffSeconds *int32 `json:"backoffSeconds,omitempty"`
	// MaxBackoffSeconds caps the retry delay.
	// +kubebuilder:default=360
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxBackoffSeconds *int32 `json:"maxBackoffSeconds,omitempty"`
	// ActiveDeadlineSeconds bounds the job's run time from its start; past it the job is Failed.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
	// TTLSecondsAfterFinished deletes the job (and with it its pods and Service) that long after it finished.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	// TrainersOnCompletion is what happens to trainers still running when the aggregator succeeds.
	// +kubebuilder:default=Stop
	// +optional
	TrainersOnCompletion TrainerCompletionPolicy `json:"trainersOnCompletion,omitempty"`
	// TrainerOfflinePolicy tells the edge agent how to heal a trainer while its node is cut off from the API
	// server; the job waits for the trainer meanwhile, within ActiveDeadlineSeconds.
	// +optional
	TrainerOfflinePolicy *OfflinePolicy `json:"trainerOfflinePolicy,omitempty"`
}

// FLJobPhase is Sedna's coarse state of a job.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type FLJobPhase string

// Phases of a FederatedLearningJob.
const (
	FLJobPending   FLJobPhase = "Pending"
	FLJobRunning   FLJobPhase = "Running"
	FLJobSucceeded FLJobPhase = "Succeeded"
	FLJobFailed    FLJobPhase = "Failed"
)

// Condition types of a FederatedLearningJob. Complete and Failed are terminal and never revert.
const (
	FLConditionTraining = "Training"
	FLConditionComplete = "Complete"
	FLConditionFailed   = "Failed"
)

// FederatedLearningJobStatus is what the controller last observed.
type FederatedLearningJobStatus struct {
	// Conditions: Training, Complete, Failed.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec this status describes. Lifeline addition.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Active counts worker pods that are pending or running.
	// +optional
	Active int32 `json:"active"`
	// Succeeded counts worker pods that finished successfully.
	// +optional
	Succeeded int32 `json:"succeeded"`
	// Failed counts worker pod failures that were charged to the backoff limit.
	// +optional
	Failed int32 `json:"failed"`
	// +optional
	Phase FLJobPhase `json:"phase,omitempty"`
	// Progress of the training rounds, from the workers' reports. Lifeline addition.
	// +optional
	Progress *TrainingProgress `json:"progress,omitempty"`
	// Workers has one entry per worker identity. Lifeline addition.
	// The controller alone writes it, whole, so it is atomic: as a map the API server would track each field of
	// each worker in the object's managed fields, on every write.
	// +listType=atomic
	// +optional
	Workers []WorkerStatus `json:"workers,omitempty"`
}

// TrainingProgress is the latest round the workers reported and what they reported for it.
type TrainingProgress struct {
	// Round is the highest round any trainer reported as done.
	Round int32 `json:"round"`
	// LastReportTime is when the latest report arrived.
	// +optional
	LastReportTime *metav1.Time `json:"lastReportTime,omitempty"`
	// Metrics of the latest round (e.g. loss, accuracy), as reported.
	// +optional
	Metrics []Metric `json:"metrics,omitempty"`
}

// FederatedLearningJobList is a list of FederatedLearningJob.
//
// +kubebuilder:object:root=true
type FederatedLearningJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FederatedLearningJob `json:"items"`
}
