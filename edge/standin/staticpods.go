// Package standin runs a worker the node lost as a static pod, a stand-in, while the node is cut off: it writes
// the worker's last known pod, held to what a pod without admission may have, into the node's static-pod
// directory, arms stand-ins ahead behind a gate while the node reaches the API server, and hands each worker back
// to its own pod. It exists because a stand-in is the agent's one way to put something of its own choosing on the
// node, which wants its checks in one place; the agent's loop only asks for a rebuild or a release
// (agent.Rebuilder, agent.Armer).
package standin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/statefile"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// DesiredWorkers are the workers that belong on the node (agent.DesiredWorkers).
type DesiredWorkers interface {
	Workers() []desired.Worker
}

// Runtime is what the agent reads of the node's container runtime: its pods (agent.WorkerSource), and what an
// image runs (cri.Client.ImageCommand).
type Runtime interface {
	Pods(ctx context.Context) ([]cri.Pod, error)
	ImageCommand(ctx context.Context, image string) (entrypoint, cmd []string, err error)
}

// GatesDir is where the agent keeps the gates of its armed stand-ins.
func GatesDir(stateDir string) string { return filepath.Join(stateDir, "gates") }

// StaticPods rebuilds a worker whose pod the node lost, as a static pod: its last known manifest is written into
// edged's manifest directory, and edged runs it without the API server. Release ends them once the node runs the
// workers' own pods again, so a worker never runs twice for long. With a GateBinary and a Runtime it arms stand-ins
// ahead (Arm), a rebuild opens an armed one's gate, and Release arms the one that ran again in place.
type StaticPods struct {
	Dir     string
	Workers DesiredWorkers
	// Bound is what a stand-in may have on the node; its Protected are node paths no stand-in may mount besides
	// SystemPaths and Dir: the agent's state, the runtime's socket.
	Bound Bound
	// GateBinary, when set, is the agent's own executable, which Arm copies into GatesDir for armed stand-ins'
	// containers to run as their gate; GatesDir holds the gates too, one directory per stand-in.
	GateBinary, GatesDir string
	// Runtime tells what the images of armed stand-ins run; with Node, it shows which armed stand-ins edged runs
	// at their gate, the ones a rebuild opens first: edged starts a pod written anew only once its mirror pod of
	// the last version is deleted, which waits minutes when a cut began meanwhile.
	Node    string
	Runtime Runtime
	// Now is the clock departures are timed by (default time.Now).
	Now func() time.Time

	// departed are the armed stand-ins of workers no longer armable, by file, since when (Arm's grace).
	departed map[string]time.Time
	// staged: GateBinary is copied into GatesDir.
	staged bool
	// images caches what images run (imageCommands).
	images imageCommands
}

// standInSlot is one of the two places a worker's stand-ins take in turn: a file in the static-pod directory and
// the name of the pod in it.
type standInSlot struct{ file, pod string }

// standInSlots are a worker's two slots. The files are named by a hash of namespace/name, so two workers never
// share one (team-a/trainer and team/a-trainer would both be "team-a-trainer" joined by a dash) and the name stays
// short and DNS-safe whatever the pod's name; edged names the pod it runs from each <pod>-<node> in the worker's
// namespace. The pods are named lifelinev1.StandInPods: the next stand-in is armed in one while the last one still
// runs in the other, since edged starts a static pod of the same full name only after the last one ended and its
// mirror pod was deleted and made anew (10-15 s on edgecore), a window a cut must not find unarmed.
func standInSlots(namespace, name string) [2]standInSlot {
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	file := staticPrefix + hex.EncodeToString(sum[:12])
	pods := lifelinev1.StandInPods(name)
	return [2]standInSlot{{file: file + ".json", pod: pods[0]}, {file: file + "-b.json", pod: pods[1]}}
}

// staticPrefix begins the name of every manifest the agent writes.
const staticPrefix = "lifeline-"

// standInOf is the manifest of w's stand-in in slot, as staticPodManifest makes it.
func (s *StaticPods) standInOf(w desired.Worker, slot standInSlot) ([]byte, error) {
	if w.ManifestRefused != "" {
		return nil, fmt.Errorf("no stand-in for %s/%s: %s", w.Namespace, w.Name, w.ManifestRefused)
	}
	if w.Manifest == "" {
		return nil, fmt.Errorf("no manifest known for %s/%s", w.Namespace, w.Name)
	}
	bound := s.Bound
	bound.Protected = append([]string{s.Dir}, bound.Protected...)
	manifest, err := staticPodManifest(w.Manifest, lifelinev1.StaticPodOf(w.Namespace, w.Name), slot.pod, bound)
	if err != nil {
		return nil, fmt.Errorf("the manifest of %s/%s: %w", w.Namespace, w.Name, err)
	}
	return manifest, nil
}

// gateDir is the gate directory of the stand-in in file.
func (s *StaticPods) gateDir(file string) string {
	return filepath.Join(s.GatesDir, strings.TrimSuffix(file, ".json"))
}

// slotState is what a worker's slot holds.
type slotState int

const (
	slotFree     slotState = iota // nothing of the agent's
	slotArmed                     // an armed stand-in, its gate closed: no stand-in yet
	slotStanding                  // a stand-in that runs, or is about to: a rebuild wrote it, or opened its gate
)

// slotOf tells what slot holds.
func (s *StaticPods) slotOf(slot standInSlot) (slotState, standIn) {
	in, ok := readStandIn(filepath.Join(s.Dir, slot.file))
	switch {
	case !ok:
		return slotFree, in
	case in.gate == "" || s.gateOpen(slot.file):
		return slotStanding, in
	}
	return slotArmed, in
}

// Rebuild runs the worker again: it opens the gate of its armed stand-in, or else writes its manifest, marked as
// the agent's (atomically: edged must never read half a file; edged skips the hidden temporary file). A stand-in
// that runs already is left as it is; one a rebuild wrote is written again, a new pod to the node.
func (s *StaticPods) Rebuild(ctx context.Context, namespace, pod, uid string) error {
	for _, w := range s.Workers.Workers() {
		if w.UID != uid {
			continue
		}
		slots := standInSlots(w.Namespace, w.Name)
		var standing *standInSlot
		var armed []armedSlot
		for _, slot := range slots {
			switch state, in := s.slotOf(slot); {
			case state == slotStanding && in.gate != "":
				return nil // its gate is open: it runs, or is about to
			case state == slotStanding:
				standing = &slot
			case state == slotArmed && in.gate == s.gateDir(slot.file):
				armed = append(armed, armedSlot{slot: slot, written: in.written})
			}
		}
		target := slots[0]
		switch {
		case standing != nil:
			target = *standing // written again, not a second one opened beside it
		case len(armed) > 0:
			open := s.readiest(ctx, w.Namespace, armed)
			if err := statefile.Write(filepath.Join(s.gateDir(open.file), gateFile), nil); err != nil {
				return fmt.Errorf("opening the gate of %s/%s's stand-in: %w", namespace, pod, err)
			}
			return nil
		}
		manifest, err := s.standInOf(w, target)
		if err == nil {
			manifest, err = stamped(manifest, time.Now())
		}
		if err != nil {
			return err
		}
		if err := statefile.Write(filepath.Join(s.Dir, target.file), manifest); err != nil {
			return fmt.Errorf("the static pod of %s/%s: %w", namespace, pod, err)
		}
		return nil
	}
	return fmt.Errorf("pod %s/%s (%s) is not one of this node's workers", namespace, pod, uid)
}

// armedSlot is a slot a rebuild may open: when its stand-in was written, and since when edged runs that stand-in's
// gate (zero: it does not, or it is the gate of a version written before).
type armedSlot struct {
	slot            standInSlot
	written, gateUp time.Time
}

// readiest is the armed slot a rebuild opens: the one whose gate edged has run longest, since edged starts a
// stand-in written anew only after it deleted the mirror pod of its last version, minutes when a cut began
// meanwhile; failing that, the one written longest ago (the other may have been armed again just now).
func (s *StaticPods) readiest(ctx context.Context, namespace string, armed []armedSlot) standInSlot {
	gates := s.runningGates(ctx, namespace)
	best := -1
	for i := range armed {
		a := &armed[i]
		if up, ok := gates[a.slot.pod+"-"+s.Node]; ok && up.After(a.written) {
			a.gateUp = up
		}
		if best < 0 || a.readierThan(armed[best]) {
			best = i
		}
	}
	return armed[best].slot
}

// readierThan: a's gate runs and b's does not, or ran first; else, neither running, a was written first.
func (a armedSlot) readierThan(b armedSlot) bool {
	switch {
	case a.gateUp.IsZero() != b.gateUp.IsZero():
		return !a.gateUp.IsZero()
	case !a.gateUp.IsZero():
		return a.gateUp.Before(b.gateUp)
	}
	return a.written.Before(b.written)
}

// runningGates are the pods of namespace whose containers run, by pod name, each with when its last container
// started (the latest, when edged runs two pods of one name while it replaces one): an armed stand-in's containers
// run its gate. None without a runtime, or when it fails to answer (a rebuild then goes by the stand-ins' stamps).
func (s *StaticPods) runningGates(ctx context.Context, namespace string) map[string]time.Time {
	if s.Runtime == nil || s.Node == "" {
		return nil
	}
	pods, err := s.Runtime.Pods(ctx)
	if err != nil {
		return nil
	}
	out := map[string]time.Time{}
	for _, p := range pods {
		for _, c := range p.Containers {
			if p.Namespace == namespace && c.Running && c.StartedAt.After(out[p.Name]) {
				out[p.Name] = c.StartedAt
			}
		}
	}
	return out
}

// Arm keeps, for each of workers its offline policy lets the agent heal, a stand-in held by a closed gate, so that
// a rebuild needs nothing from the cloud: its armed ones are kept (written again in place when the worker's pod
// changed), and when none is, one is armed in a free slot, beside a stand-in that runs. It removes the armed
// stand-ins of pods no longer among workers, and every one still closed when there is no GateBinary (arming was
// turned off), once they were so for DepartureGrace. A stand-in that runs is left to Release. To be called while
// the node reaches the API server, which creates each new stand-in's mirror pod then.
func (s *StaticPods) Arm(ctx context.Context, workers []desired.Worker) error {
	if s.GatesDir == "" {
		return nil
	}
	var errs []error
	if err := s.stageGate(); err != nil {
		return err
	}
	s.images.forget(s.now())
	want := map[string]bool{}
	for _, w := range workers {
		if !s.armable(w) {
			continue
		}
		var free []standInSlot
		armed := false
		for _, slot := range standInSlots(w.Namespace, w.Name) {
			switch state, _ := s.slotOf(slot); state {
			case slotArmed:
				want[slot.file], armed = true, true
				errs = append(errs, s.arm(ctx, w, slot))
			case slotFree:
				free = append(free, slot)
			}
		}
		if !armed && len(free) > 0 {
			want[free[0].file] = true
			errs = append(errs, s.arm(ctx, w, free[0]))
		}
	}
	files, err := filepath.Glob(filepath.Join(s.Dir, staticPrefix+"*.json"))
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	now, departed := s.now(), map[string]time.Time{}
	for _, f := range files {
		file := filepath.Base(f)
		if in, ok := readStandIn(f); !ok || in.gate == "" || want[file] || s.gateOpen(file) {
			continue
		}
		since, seen := s.departed[file]
		if !seen {
			since = now
		}
		if now.Sub(since) < DepartureGrace {
			departed[file] = since
			continue
		}
		errs = append(errs, s.remove(file))
	}
	s.departed = departed
	return errors.Join(errs...)
}

// DepartureGrace is how long an armed stand-in outlives its worker's departure from the node's workers. A worker
// whose pod is replaced under its own name (an FL trainer) leaves them for a moment and comes back; and removing
// a static pod's file orphans its mirror pod, whose deletion edged's housekeeping waits for, holding every pod's
// start: for two minutes of message timeouts per pod when a cut begins meanwhile.
const DepartureGrace = 30 * time.Second

func (s *StaticPods) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// armable: the agent arms w's stand-ins (it has a gate binary and a runtime, w's offline policy lets it heal, and
// its manifest is known).
func (s *StaticPods) armable(w desired.Worker) bool {
	return s.GateBinary != "" && s.Runtime != nil && w.OfflinePolicy != lifelinev1.OfflinePolicyNone && w.Manifest != ""
}

// arm writes w's stand-in into slot behind a closed gate, unless it is there already.
func (s *StaticPods) arm(ctx context.Context, w desired.Worker, slot standInSlot) error {
	manifest, err := s.armedOf(ctx, w, slot)
	if err != nil || manifest == nil {
		return err
	}
	if written, err := os.ReadFile(filepath.Join(s.Dir, slot.file)); err == nil && bytes.Equal(unstamped(written), manifest) {
		return nil // armed already
	}
	return s.writeArmed(w, slot, manifest)
}

// writeArmed closes slot's gate and writes manifest there, stamped: a new pod to the node, which waits at its gate.
func (s *StaticPods) writeArmed(w desired.Worker, slot standInSlot, manifest []byte) error {
	gate := s.gateDir(slot.file)
	if err := os.MkdirAll(gate, 0o755); err != nil {
		return fmt.Errorf("the gate of %s/%s's stand-in: %w", w.Namespace, w.Name, err)
	}
	if err := os.Remove(filepath.Join(gate, gateFile)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("closing the gate of %s/%s's stand-in: %w", w.Namespace, w.Name, err)
	}
	manifest, err := stamped(manifest, time.Now())
	if err != nil {
		return err
	}
	if err := statefile.Write(filepath.Join(s.Dir, slot.file), manifest); err != nil {
		return fmt.Errorf("arming %s/%s's stand-in: %w", w.Namespace, w.Name, err)
	}
	return nil
}

// gateOpen tells whether the armed stand-in in file has its gate open: it runs, or is about to.
func (s *StaticPods) gateOpen(file string) bool {
	if s.GatesDir == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(s.gateDir(file), gateFile))
	return err == nil
}

// standIn is what readStandIn reads of a manifest the agent wrote.
type standIn struct {
	core.StandIn
	// gate is the gate directory of an armed stand-in; empty for a stand-in written by a rebuild.
	gate string
	// written is when the agent wrote it (its WrittenAnnotation); zero if unstamped.
	written time.Time
}

// readStandIn reads the manifest at path when the agent wrote it: it carries the StaticPodOfAnnotation naming a
// worker one of whose slots is this file. A file someone else put there, even named lifeline-*, is not the agent's.
func readStandIn(path string) (standIn, bool) {
	f, err := os.Open(path)
	if err != nil {
		return standIn{}, false
	}
	defer f.Close()
	var pod desired.Pod
	if json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&pod) != nil {
		return standIn{}, false
	}
	namespace, name, ok := lifelinev1.ParseStaticPodOf(pod.Metadata.Annotations[lifelinev1.StaticPodOfAnnotation])
	slots := standInSlots(namespace, name)
	if !ok || !slices.ContainsFunc(slots[:], func(s standInSlot) bool { return s.file == filepath.Base(path) }) {
		return standIn{}, false
	}
	return standIn{StandIn: core.StandIn{Namespace: namespace, Pod: name, WorkerName: desired.WorkerNameOf(&pod)},
		gate: pod.Metadata.Annotations[ArmedAnnotation], written: writtenAt(pod.Metadata.Annotations[WrittenAnnotation])}, true
}

// StandIns lists the stand-ins that run, or are about to, each with the pod it stands in for and that pod's
// WORKER_NAME: those a rebuild wrote, and the armed ones whose gate is open.
func (s *StaticPods) StandIns() ([]core.StandIn, error) {
	files, err := filepath.Glob(filepath.Join(s.Dir, staticPrefix+"*.json"))
	if err != nil {
		return nil, err
	}
	var out []core.StandIn
	for _, f := range files {
		if in, ok := readStandIn(f); ok && (in.gate == "" || s.gateOpen(filepath.Base(f))) {
			out = append(out, in.StandIn)
		}
	}
	return out, nil
}

// Release ends the stand-ins of namespace/pod that run, or are about to: each is written again in place, armed
// behind a closed gate, while the node's workers still hold that pod; removed, with its gate, otherwise. A file of
// a worker the node keeps is never removed, because removing a static pod's file orphans its mirror pod, and
// edged's housekeeping, which every pod's start waits for, waits on that mirror pod's deletion: for two minutes of
// message timeouts when a cut begins meanwhile (the stand-in armed in the other slot would not start until then).
func (s *StaticPods) Release(namespace, pod string) error {
	var errs []error
	for _, slot := range standInSlots(namespace, pod) {
		if state, _ := s.slotOf(slot); state != slotStanding {
			continue
		}
		if w, ok := s.worker(namespace, pod); ok && s.armable(w) {
			manifest, err := s.armedOf(context.Background(), w, slot)
			if err == nil && manifest != nil {
				errs = append(errs, s.writeArmed(w, slot, manifest))
				continue
			}
		}
		errs = append(errs, s.remove(slot.file))
	}
	return errors.Join(errs...)
}

// worker is the node's worker whose pod is namespace/pod, if the node has it.
func (s *StaticPods) worker(namespace, pod string) (desired.Worker, bool) {
	for _, w := range s.Workers.Workers() {
		if w.Namespace == namespace && w.Name == pod {
			return w, true
		}
	}
	return desired.Worker{}, false
}

// remove removes the stand-in in file and its gate.
func (s *StaticPods) remove(file string) error {
	f := filepath.Join(s.Dir, file)
	if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing the static pod %s: %w", f, err)
	}
	if s.GatesDir != "" {
		if err := os.RemoveAll(s.gateDir(file)); err != nil {
			return fmt.Errorf("removing the gate of %s: %w", f, err)
		}
	}
	return nil
}

// RemoveAll removes every stand-in the agent wrote, armed or running, with its gate: Lifeline is uninstalled.
func (s *StaticPods) RemoveAll() error {
	files, err := filepath.Glob(filepath.Join(s.Dir, staticPrefix+"*.json"))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		if _, ok := readStandIn(f); ok {
			errs = append(errs, s.remove(filepath.Base(f)))
		}
	}
	return errors.Join(errs...)
}
