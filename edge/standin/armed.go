package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// An armed stand-in is a worker's stand-in written ahead, while the node reaches the API server, and held before
// its containers by a gate: an init container of the agent's own image that waits for a file. A node creates a
// static pod's mirror pod before it starts it, through the API server; on a link that broke but is not yet known
// broken that request waits (edged: beehive's 60 s; the kubelet: its HTTP/2 health check and a new dial). Armed
// ahead, the mirror pod exists before the cut, and a rebuild only opens the gate: the worker runs within a poll of
// the node's, in every phase of a cut.
const (
	// ArmedAnnotation on a stand-in's manifest names its gate directory: the stand-in is armed, and runs once the
	// gate file is there.
	ArmedAnnotation = "lifeline.sedna.io/stand-in-gate"
	// gateContainer is the init container that holds an armed stand-in.
	gateContainer = "lifeline-gate"
	// gateFile is the file in a gate directory that opens it.
	gateFile = "open"
)

// WrittenAnnotation stamps each stand-in with when the agent wrote it, so that no two stand-ins have one UID: a
// node takes a static pod's UID from its manifest, and a kubelet starts no pod of a UID it ended until its
// housekeeping purged that UID (pkg/kubelet/pod_workers.go). On the KubeEdge rig a worker's stand-in written again
// 6.5 s and 27.5 s after the last one was removed never ran.
const WrittenAnnotation = "lifeline.sedna.io/stand-in-written"

// stamped is manifest with WrittenAnnotation set to at.
func stamped(manifest []byte, at time.Time) ([]byte, error) {
	return withAnnotation(manifest, WrittenAnnotation, at.UTC().Format(time.RFC3339Nano))
}

// writtenAt reads a WrittenAnnotation value; zero when it does not parse.
func writtenAt(v string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, v)
	return t
}

// unstamped is manifest without WrittenAnnotation, to compare what two stand-ins run; nil if it does not decode.
func unstamped(manifest []byte) []byte {
	out, err := withAnnotation(manifest, WrittenAnnotation, "")
	if err != nil {
		return nil
	}
	return out
}

// withAnnotation sets the annotation key to value in a pod manifest, or removes it when value is empty.
func withAnnotation(manifest []byte, key, value string) ([]byte, error) {
	var pod map[string]any
	if err := json.Unmarshal(manifest, &pod); err != nil {
		return nil, fmt.Errorf("decoding the stand-in: %w", err)
	}
	annotations := annotationsOf(pod)
	if value == "" {
		delete(annotations, key)
	} else {
		annotations[key] = value
	}
	return json.Marshal(pod)
}

// armedManifest is the stand-in manifest (staticPodManifest's) held by a gate in gateDir: the gate container of
// gateImage first, with gateDir mounted read-only at the same path (a node's runtime and the simulation's
// processes alike see it there). Its containers keep their CPU and memory limits, so a worker healed offline is
// held to them as its pod was, but ask for next to nothing (armedRequests): an armed stand-in must not reserve
// the node's resources beside its worker, which the node admits, and may refuse, against every pod it runs; for
// the same reason it asks for no extended resource (a GPU) at all. The gate runs as a user that is not root, so
// it starts in a pod that must not run as root.
func armedManifest(manifest []byte, gateDir, gateImage string) ([]byte, error) {
	var pod map[string]any
	if err := json.Unmarshal(manifest, &pod); err != nil {
		return nil, fmt.Errorf("decoding the stand-in: %w", err)
	}
	spec, _ := pod["spec"].(map[string]any)
	if spec == nil {
		return nil, errors.New("the stand-in has no spec")
	}
	annotationsOf(pod)[ArmedAnnotation] = gateDir
	for _, container := range containersOf(spec) {
		if resources := armedResources(container["resources"]); resources != nil {
			container["resources"] = resources
		} else {
			delete(container, "resources")
		}
	}
	gate := map[string]any{"name": gateContainer, "image": gateImage, "imagePullPolicy": "IfNotPresent",
		"args":         []any{"gate", "--path", filepath.Join(gateDir, gateFile)},
		"volumeMounts": []any{map[string]any{"name": gateContainer, "mountPath": gateDir, "readOnly": true}},
		"securityContext": map[string]any{"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
			"runAsNonRoot": true, "runAsUser": gateUser, "runAsGroup": gateUser,
			"capabilities": map[string]any{"drop": []any{"ALL"}}, "seccompProfile": map[string]any{"type": "RuntimeDefault"}}}
	spec["initContainers"] = append([]any{gate}, list(spec["initContainers"])...)
	spec["volumes"] = append(list(spec["volumes"]), map[string]any{"name": gateContainer,
		"hostPath": map[string]any{"path": gateDir, "type": "Directory"}})
	return json.Marshal(pod)
}

// gateUser is the uid and gid the gate runs as: the agent image's unprivileged user, which may read the gate
// directory (0755) and nothing else of the node's.
const gateUser = 65532

// armedRequests are what an armed stand-in's container asks for of each resource it has a limit of: a node sets
// a request left out to the limit, which would reserve the worker's resources twice.
var armedRequests = map[string]string{"cpu": "1m", "memory": "1Mi", "ephemeral-storage": "1Mi"}

// armedResources is an armed stand-in container's resources: its limits of CPU, memory and ephemeral storage,
// each with armedRequests' request; nil when it has none.
func armedResources(resources any) map[string]any {
	asked, _ := resources.(map[string]any)
	limits, _ := asked["limits"].(map[string]any)
	kept, requests := map[string]any{}, map[string]any{}
	for name, limit := range limits {
		if request, ok := armedRequests[name]; ok {
			kept[name], requests[name] = limit, request
		}
	}
	if len(kept) == 0 {
		return nil
	}
	return map[string]any{"limits": kept, "requests": requests}
}

// WaitForGate returns once path exists, checking every poll: what an armed stand-in's gate container runs
// (lifeline-agent gate --path).
func WaitForGate(path string, poll time.Duration) {
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(poll)
	}
}
