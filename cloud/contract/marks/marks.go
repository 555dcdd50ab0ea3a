// Package marks holds Lifeline's own marks on worker pods, shared by the controller that sets them and the edge
// agent that reads them. It imports nothing, so the agent stays small.
package marks

const (
	// RoleLabel on a worker pod names its role (edge, cloud, aggregator, trainer); the controller's pod cache
	// and the edge agent select worker pods by it.
	RoleLabel = "lifeline.sedna.io/role"
	// OfflinePolicyAnnotation on a worker pod tells the edge agent what to do for it while the node is cut off
	// from the API server.
	OfflinePolicyAnnotation = "lifeline.sedna.io/offline-policy"
	// DatasetAnnotation, DatasetIndexAnnotation and DatasetFormatAnnotation on a trainer pod name its Dataset,
	// the index file of that Dataset on the node (a node path) and its format (txt or csv), so the node's agent
	// counts the Dataset's samples as Sedna's local controller does.
	DatasetAnnotation       = "lifeline.sedna.io/dataset"
	DatasetIndexAnnotation  = "lifeline.sedna.io/dataset-index"
	DatasetFormatAnnotation = "lifeline.sedna.io/dataset-format"
)
