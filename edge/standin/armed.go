package standin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/statefile"
)

// An armed stand-in is a worker's stand-in written ahead, while the node reaches the API server, and held by a
// gate: each of its containers runs the agent's own binary first, which waits for a file and then executes what
// the container would have run. A node creates a static pod's mirror pod before it starts it, through the API
// server; on a link that broke but is not yet known broken that request waits (edged: beehive's 60 s; the
// kubelet: its HTTP/2 health check and a new dial). Armed ahead, the mirror pod exists before the cut, and a
// rebuild only opens the gate: the worker runs within a poll of the node's, in every phase of a cut.
//
// The gate is inside the worker's containers, not an init container before them, so that an armed stand-in is a
// Running pod: monitoring that flags pods Pending or containers waiting (kube-prometheus' KubePodNotReady and
// KubeContainerWaiting) has nothing to flag on a healthy node. It is never Ready (GateCondition), so no Service
// sends it traffic, and it has no probes: the worker's would fail behind the gate, raising events and restarts.
const (
	// ArmedAnnotation on a stand-in's manifest names its gate directory: the stand-in is armed, and runs once the
	// gate file is there.
	ArmedAnnotation = "lifeline.sedna.io/stand-in-gate"
	// GateCondition is an armed stand-in's readiness gate, a pod condition no one sets.
	GateCondition = "lifeline.sedna.io/stand-in"
	// gateVolume mounts the gate directory into an armed stand-in's containers; gateBinaryVolume the gate's binary.
	gateVolume, gateBinaryVolume = "lifeline-gate", "lifeline-gate-binary"
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

// gate is where an armed stand-in's gate is on the node: its directory, and the binary its containers run first.
// Both are mounted read-only at the same paths (a node's runtime and the simulation's processes alike see them
// there), and may be read and run by any user, so the gate runs as the container's own user.
type gate struct{ dir, binary string }

// armedManifest is the stand-in manifest (staticPodManifest's) held by g: each container runs g's binary, which
// waits for the gate file, then executes the container's command (commandOf tells an image's, for a container
// that names none). Its containers keep their CPU and memory limits, so a worker healed offline is held to them as
// its pod was, but ask for next to nothing (armedRequests): an armed stand-in must not reserve the node's
// resources beside its worker, which the node admits, and may refuse, against every pod it runs; for the same
// reason it asks for no extended resource (a GPU) at all. Its init containers are held by the gate too, so none
// runs (a model's download, a registration) while the worker does, every time a stand-in is armed; a worker that
// has them therefore has a stand-in Pending at its first init container until a rebuild opens the gate.
func armedManifest(manifest []byte, g gate, commandOf func(image string) (ImageCommand, error)) ([]byte, error) {
	var pod map[string]any
	if err := json.Unmarshal(manifest, &pod); err != nil {
		return nil, fmt.Errorf("decoding the stand-in: %w", err)
	}
	spec, _ := pod["spec"].(map[string]any)
	if spec == nil {
		return nil, errors.New("the stand-in has no spec")
	}
	annotationsOf(pod)[ArmedAnnotation] = g.dir
	for _, container := range containersOf(spec) {
		if resources := armedResources(container["resources"]); resources != nil {
			container["resources"] = resources
		} else {
			delete(container, "resources")
		}
	}
	for _, c := range append(list(spec["initContainers"]), list(spec["containers"])...) {
		container, _ := c.(map[string]any)
		argv, err := commandLine(container, commandOf)
		if err != nil {
			return nil, err
		}
		container["command"] = append([]any{g.binary, "gate", "--path", filepath.Join(g.dir, gateFile), "--"}, argv...)
		delete(container, "args")
		for _, probe := range probeFields {
			delete(container, probe)
		}
		container["volumeMounts"] = append(list(container["volumeMounts"]),
			map[string]any{"name": gateVolume, "mountPath": g.dir, "readOnly": true},
			map[string]any{"name": gateBinaryVolume, "mountPath": g.binary, "readOnly": true})
	}
	spec["readinessGates"] = append(list(spec["readinessGates"]), map[string]any{"conditionType": GateCondition})
	spec["volumes"] = append(list(spec["volumes"]),
		map[string]any{"name": gateVolume, "hostPath": map[string]any{"path": g.dir, "type": "Directory"}},
		map[string]any{"name": gateBinaryVolume, "hostPath": map[string]any{"path": g.binary, "type": "File"}})
	return json.Marshal(pod)
}

// probeFields are a container's probes.
var probeFields = []string{"livenessProbe", "readinessProbe", "startupProbe"}

// ImageCommand is what an image runs when a container names no command: its entrypoint and default arguments.
type ImageCommand struct{ Entrypoint, Cmd []string }

// commandLine is what a container runs, as a node decides it: its command and arguments; with no command, its
// image's entrypoint and its arguments, or the image's default ones. What comes from the image has its "$"
// doubled, since the node expands $(VAR) in a container's command, which it does not in an image's.
func commandLine(container map[string]any, commandOf func(image string) (ImageCommand, error)) ([]any, error) {
	name, _ := container["name"].(string)
	command, err1 := stringsAt(container, "command")
	args, err2 := stringsAt(container, "args")
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("container %s: %w", name, err)
	}
	if len(command) > 0 {
		return append(command, args...), nil
	}
	image, _ := container["image"].(string)
	ic, err := commandOf(image)
	if err != nil {
		return nil, fmt.Errorf("container %s: the command of image %s: %w", name, image, err)
	}
	argv := escaped(ic.Entrypoint)
	if len(args) > 0 {
		argv = append(argv, args...)
	} else {
		argv = append(argv, escaped(ic.Cmd)...)
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("container %s: neither it nor its image %s names a command", name, image)
	}
	return argv, nil
}

// stringsAt is the list of strings at key of a decoded object.
func stringsAt(object map[string]any, key string) ([]any, error) {
	out := list(object[key])
	for _, v := range out {
		if _, ok := v.(string); !ok {
			return nil, fmt.Errorf("%s holds a %T", key, v)
		}
	}
	return out, nil
}

// escaped is an image's command line as a container's command, which the node expands.
func escaped(argv []string) []any {
	out := make([]any, len(argv))
	for i, a := range argv {
		out[i] = strings.ReplaceAll(a, "$", "$$")
	}
	return out
}

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

// armedOf is w's armed stand-in in slot; nil when the manifest is refused (a rebuild says why).
func (s *StaticPods) armedOf(ctx context.Context, w desired.Worker, slot standInSlot) ([]byte, error) {
	standIn, err := s.standInOf(w, slot)
	if err != nil {
		return nil, nil
	}
	g := gate{dir: s.gateDir(slot.file), binary: s.gateBinary()}
	manifest, err := armedManifest(standIn, g, func(image string) (ImageCommand, error) {
		return s.images.of(ctx, s.Runtime, image, s.now())
	})
	if err != nil {
		return nil, fmt.Errorf("arming %s/%s's stand-in: %w", w.Namespace, w.Name, err)
	}
	return manifest, nil
}

// gateBinary is where the gate's binary is staged, beside the gates' directories.
func (s *StaticPods) gateBinary() string { return filepath.Join(s.GatesDir, ".bin", "lifeline-gate") }

// stageGate copies GateBinary into GatesDir once in the agent's life, mode 0755 for any container user. A gate
// waiting already keeps the copy it runs: a file renamed over is a new file to the mounts made after.
func (s *StaticPods) stageGate() error {
	if s.staged || s.GateBinary == "" {
		return nil
	}
	binary, err := os.ReadFile(s.GateBinary)
	if err != nil {
		return fmt.Errorf("reading the gate's binary: %w", err)
	}
	staged := s.gateBinary()
	old, err := os.ReadFile(staged)
	info, statErr := os.Stat(staged)
	if err != nil || statErr != nil || !bytes.Equal(old, binary) || info.Mode().Perm() != 0o755 {
		if err := os.MkdirAll(filepath.Dir(staged), 0o755); err != nil {
			return fmt.Errorf("staging the gate's binary: %w", err)
		}
		if err := statefile.WriteMode(staged, binary, 0o755); err != nil {
			return fmt.Errorf("staging the gate's binary: %w", err)
		}
	}
	s.staged = true
	return nil
}

// WaitForGate returns once path exists, checking every poll: what an armed stand-in's containers run first
// (lifeline-agent gate --path).
func WaitForGate(path string, poll time.Duration) {
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(poll)
	}
}

// ExecWorker replaces the gate's process with the container's command line argv, found on the container's PATH
// as a node's runtime finds it; it returns only when that fails.
func ExecWorker(argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command to run")
	}
	path, err := exec.LookPath(argv[0])
	if errors.Is(err, exec.ErrDot) {
		err = nil // found through a relative PATH entry, which a node's runtime follows too
	}
	if err != nil {
		return fmt.Errorf("finding %s: %w", argv[0], err)
	}
	return syscall.Exec(path, argv, os.Environ())
}
