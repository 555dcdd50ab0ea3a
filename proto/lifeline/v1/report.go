package lifelinev1

// MaxReportBodyBytes bounds a report's body, on the node's report endpoint and at the controller; Sedna's
// reports are a few hundred bytes.
const MaxReportBodyBytes = 64 << 10

// AgentClientID is the MQTT client id of a node's agent; the embedded broker admits a node under this id only
// [P-AUTH-4].
func AgentClientID(node string) string { return "lifeline-agent-" + node }

// Report is the Sedna worker report: the JSON body workers POST to their LC endpoint, which a WorkerReport
// carries as it was received [P-REP-1]. The agent checks it, the controller reads it. Its keys are those Sedna's
// worker library sends (lib/sedna/core: report_task_info and LCReporter); nothing else is read.
type Report struct {
	// Name is the worker's WORKER_NAME; Namespace the workload's namespace.
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// OwnerName is JOB_NAME, else SERVICE_NAME. The library defaults JOB_NAME to "sedna", so a JI worker (whose
	// pod sets SERVICE_NAME only) names "sedna": the controller takes the owner from the worker's pod, never from
	// here.
	OwnerName string `json:"ownerName"`
	// OwnerKind is "jointinferenceservice" from a JI edge worker, "default" from an FL trainer (the library's
	// default kind); like OwnerName it is informative only.
	OwnerKind string `json:"ownerKind"`
	// Kind is "train", "eval", "deploy" or "inference"; Status "running", "completed" or "failed" (a JI edge
	// worker sends none).
	Kind   string `json:"kind"`
	Status string `json:"status,omitempty"`
	// OwnerInfo holds a JI edge worker's counters (inferenceNumber, hardExampleNumber, uploadCloudRatio,
	// startTime, updateTime) or an FL trainer's round (currentRound, sampleCount, startTime, updateTime).
	OwnerInfo map[string]any `json:"ownerInfo,omitempty"`
	// Results is what a trainer's estimator says of the model it saved this round (model_info): one entry per
	// model file. JI workers send an empty list.
	Results []ReportResult `json:"results"`
}

// ReportResult is one model a trainer saved, as Sedna's estimators describe it.
type ReportResult struct {
	Format string `json:"format,omitempty"`
	URL    string `json:"url,omitempty"`
	// Metrics maps a metric's name to its value: a number, a text, or a list (e.g. per-epoch values).
	Metrics map[string]any `json:"metrics,omitempty"`
}

// TimeLayout is how workers write times in ownerInfo (startTime, updateTime): local time of the node.
const TimeLayout = "2006-01-02 15:04:05"
