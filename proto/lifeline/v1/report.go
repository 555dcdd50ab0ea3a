package lifelinev1

// MaxReportBodyBytes bounds a report's body, on the node's report endpoint and at the controller; Sedna's
// reports are a few hundred bytes.
const MaxReportBodyBytes = 64 << 10

// AgentClientID is the MQTT client id of a node's agent; the embedded broker admits a node under this id only
// [P-AUTH-4].
func AgentClientID(node string) string { return "lifeline-agent-" + node }

// Report is the Sedna worker report: the JSON body workers POST to their LC endpoint, which a WorkerReport
// carries as it was received [P-REP-1]. The agent checks it, the controller reads it.
type Report struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	OwnerName string `json:"ownerName"`
	// OwnerKind is "jointinferenceservice" or "federatedlearningjob".
	OwnerKind string `json:"ownerKind"`
	// Kind is "train", "eval", "deploy" or "inference"; Status "running", "completed" or "failed".
	Kind   string `json:"kind"`
	Status string `json:"status"`
	// OwnerInfo holds a JI edge worker's counters (inferenceNumber, hardExampleNumber, uploadCloudRatio).
	OwnerInfo map[string]any `json:"ownerInfo,omitempty"`
	// Results holds a trainer's per-round results (round, loss, ...).
	Results []map[string]any `json:"results,omitempty"`
}
