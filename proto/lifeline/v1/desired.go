package lifelinev1

// The bounds of a node's DesiredWorkers set [P-DES-3], the same the agent holds every pod source to: a tenant may
// bind a few dozen pods of about 1.5 MiB each to a node, and kept whole they would take the agent past its memory
// limit, and with it the heartbeats and the offline healing of every tenant of the node.
const (
	// MaxManifestBytes bounds a worker's static-pod manifest: a worker whose manifest is larger is watched but gets
	// no stand-in, offline or armed.
	MaxManifestBytes = 128 << 10
	// MaxDesiredBytes bounds the manifests of a node's workers together: beyond it the largest are left out first.
	MaxDesiredBytes = 4 << 20
	// MaxWorkers bounds how many workers a node has; a kubelet runs at most 110 pods by default.
	MaxWorkers = 1024
	// MaxDesiredPayloadBytes bounds a DesiredWorkers message: its manifests, and 1 KiB a worker on average for the
	// marks of those whose manifest was left out; beyond it, the workers with the largest marks are left out.
	MaxDesiredPayloadBytes = MaxDesiredBytes + MaxWorkers*(1<<10)
	// MaxMarkBytes bounds each mark of a pod the agent reads (a Lifeline annotation, WORKER_NAME): longer ones are
	// not kept.
	MaxMarkBytes = 4 << 10
)
