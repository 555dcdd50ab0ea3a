package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
)

// armedPod is what the tests read of an armed stand-in's manifest.
type armedPod struct {
	Metadata struct{ Annotations map[string]string }
	Spec     struct {
		InitContainers []struct{ Name string }
		Containers     []struct {
			Name                                        string
			Command, Args                               []string
			Resources                                   map[string]any
			LivenessProbe, ReadinessProbe, StartupProbe any
			VolumeMounts                                []struct {
				Name, MountPath string
				ReadOnly        bool
			}
		}
		ReadinessGates []struct{ ConditionType string }
		Volumes        []struct {
			Name     string
			HostPath *struct{ Path, Type string }
		}
	}
}

// runtimeOf answers what a node's runtime has: its pods, and the entrypoint (Cmd none) of each image it has.
type runtimeOf struct {
	pods   []cri.Pod
	err    error
	images map[string][]string
}

func (r runtimeOf) Pods(context.Context) ([]cri.Pod, error) { return r.pods, r.err }

func (r runtimeOf) ImageCommand(_ context.Context, image string) (entrypoint, cmd []string, err error) {
	if e, ok := r.images[image]; ok {
		return e, nil, nil
	}
	return nil, nil, fmt.Errorf("image %s is not on the node", image)
}

// withImages is a runtime that has the tests' images: the trainer's and the one of manifestOf.
var withImages = runtimeOf{images: map[string][]string{"trainer": {"/train", "--epochs=1"}, "w": {"/w"}}}

// agentBinary is a file standing for the agent's binary, which armed stand-ins run as their gate.
func agentBinary(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lifeline-agent")
	if err := os.WriteFile(path, []byte("the agent's binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	return path
}

func readArmed(t *testing.T, path string) armedPod {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pod armedPod
	if err := json.Unmarshal(data, &pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// [P-HEAL-3] Armed ahead, a worker's stand-in waits behind a closed gate and is no stand-in yet; a rebuild opens
// its gate without writing its manifest again (the node keeps the pod, and its mirror pod, it already has), and
// it stands in until Release, after which it is armed again. A worker gone takes its armed stand-in with it; one
// whose offline policy is None gets none.
func TestArmedStandInIsOpenedByARebuildAndArmedAgainAfterItsRelease_P_HEAL_3(t *testing.T) {
	dir, gates := t.TempDir(), filepath.Join(t.TempDir(), "gates")
	trainer := desired.Worker{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: withSpec(t, "container.resources",
		`{"requests":{"cpu":"2"},"limits":{"memory":"1Gi","nvidia.com/gpu":"1"}}`)}
	kept := desired.Worker{Namespace: "default", Name: "w", UID: "u2", Manifest: manifestOf("default", "w"), OfflinePolicy: "None"}
	workers := fixedWorkers{trainer, kept}
	now := time.Unix(1e9, 0)
	s := &StaticPods{Dir: dir, Workers: workers, GateBinary: agentBinary(t), GatesDir: gates, Runtime: withImages, Now: func() time.Time { return now }}
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file)
	pod := readArmed(t, file)
	gate := s.gateDir(standInSlots("default", "fl-trainer-0")[0].file)
	binary := filepath.Join(gates, ".bin", "lifeline-gate")
	c := pod.Spec.Containers[0]
	if want := []string{binary, "gate", "--path", filepath.Join(gate, "open"), "--", "/train", "--epochs=1"}; pod.Metadata.Annotations[ArmedAnnotation] != gate ||
		!slices.Equal(c.Command, want) || len(c.Args) != 0 || len(pod.Spec.InitContainers) != 0 {
		t.Fatalf("armed stand-in %+v, want its container to run %q", pod, want)
	}
	if staged, err := os.Stat(binary); err != nil || staged.Mode().Perm() != 0o755 {
		t.Errorf("the gate's binary staged at %s: %v, %v; want it there, anyone's to run", binary, staged, err)
	}
	// Item 5 of the third hardening round: a stand-in healed offline is held to its worker's memory limit, yet
	// reserves next to nothing beside its worker, and no GPU the worker holds.
	if r := fmt.Sprint(c.Resources); r != "map[limits:map[memory:1Gi] requests:map[memory:1Mi]]" {
		t.Errorf("the armed stand-in's resources %s, want its memory limit kept and next to nothing asked for", r)
	}
	if len(pod.Spec.ReadinessGates) != 1 || pod.Spec.ReadinessGates[0].ConditionType != GateCondition {
		t.Errorf("readiness gates %+v, want %s alone: an armed stand-in is never Ready", pod.Spec.ReadinessGates, GateCondition)
	}
	mounted := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			mounted[v.HostPath.Path] = v.HostPath.Type
		}
	}
	if info, err := os.Stat(gate); err != nil || !info.IsDir() || mounted[gate] != "Directory" || mounted[binary] != "File" || filepath.Dir(gate) != gates {
		t.Errorf("the gate directory %s (%v) is not there, or it or the gate's binary is not mounted: %v", gate, err, mounted)
	}
	readOnly := map[string]bool{}
	for _, m := range c.VolumeMounts {
		readOnly[m.MountPath] = m.ReadOnly
	}
	if !readOnly[gate] || !readOnly[binary] {
		t.Errorf("the container's mounts %+v, want the gate and its binary read-only where they are on the node", c.VolumeMounts)
	}
	if _, err := os.Stat(filepath.Join(dir, standInSlots("default", "w")[0].file)); !os.IsNotExist(err) {
		t.Errorf("a worker whose offline policy is None was armed (%v)", err)
	}
	if got, _ := s.StandIns(); len(got) != 0 {
		t.Fatalf("stand-ins %v behind a closed gate", got)
	}
	before, _ := os.ReadFile(file)
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(file); string(again) != string(before) {
		t.Error("arming again wrote the armed stand-in again: the node would make it a new pod")
	}

	if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(file); string(after) != string(before) {
		t.Error("the rebuild wrote the armed manifest again: the node would make a new pod, and wait for its mirror pod")
	}

	done := make(chan struct{})
	go func() { WaitForGate(filepath.Join(gate, "open"), time.Millisecond); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not open")
	}
	want := []core.StandIn{{Namespace: "default", Pod: "fl-trainer-0"}}
	if got, _ := s.StandIns(); !slices.Equal(got, want) {
		t.Errorf("stand-ins %v once the gate is open, want %v", got, want)
	}
	if err := s.Arm(context.Background(), fixedWorkers{}); err != nil { // the trainer's pod is gone from the API server: its stand-in runs on
		t.Fatal(err)
	}
	if got, _ := s.StandIns(); !slices.Equal(got, want) {
		t.Errorf("arming removed a stand-in that runs: %v", got)
	}

	if err := s.Release("default", "fl-trainer-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(gate, "open")); !os.IsNotExist(err) || readArmed(t, file).Metadata.Annotations[ArmedAnnotation] != gate {
		t.Error("not armed again in place, closed, by the release")
	}
	if again, _ := os.ReadFile(file); string(again) == string(before) {
		t.Error("the release left the stand-in's pod as it was: the node would not make it anew behind its closed gate")
	}
	s.Workers = fixedWorkers{kept} // the trainer's pod gone: its stand-in goes at its release
	if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err == nil {
		t.Error("rebuilt a worker the node no longer has")
	}
	if err := os.WriteFile(filepath.Join(gate, "open"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("default", "fl-trainer-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gate); !os.IsNotExist(err) {
		t.Errorf("the gate of a worker gone outlived its release (%v)", err)
	}
	s.Workers = workers
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(gate, "open")); !os.IsNotExist(err) || readArmed(t, file).Metadata.Annotations[ArmedAnnotation] != gate {
		t.Error("not armed again, closed, after the release")
	}
	armed, _ := os.ReadFile(file)
	// The worker leaves the node's workers, comes back (its pod replaced under its name), leaves again: its armed
	// stand-in stays as it is until it was gone DepartureGrace in one stretch.
	for _, step := range []struct {
		workers fixedWorkers
		after   time.Duration
		kept    bool
	}{
		{fixedWorkers{kept}, 0, true},
		{fixedWorkers{kept}, DepartureGrace - time.Second, true},
		{workers, time.Second, true},
		{fixedWorkers{kept}, time.Second, true},
		{fixedWorkers{kept}, DepartureGrace - time.Second, true},
		{fixedWorkers{kept}, time.Second, false},
	} {
		now = now.Add(step.after)
		if err := s.Arm(context.Background(), step.workers); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(file); step.kept != (err == nil) || (step.kept && string(got) != string(armed)) {
			t.Fatalf("%d workers, %v later: the armed stand-in kept as it was %t (%v), want %t", len(step.workers), step.after, err == nil, err, step.kept)
		}
	}
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	s.GateBinary = "" // arming turned off: the closed stand-ins go, after the grace too
	for _, after := range []time.Duration{0, DepartureGrace} {
		now = now.Add(after)
		if err := s.Arm(context.Background(), workers); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("an armed stand-in outlived arming (%v)", err)
	}
	s.GateBinary = agentBinary(t)
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveAll(); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("left after RemoveAll: %v", left)
	}
}

// A stand-in a rebuild wrote (before arming, or before the node first reached the API server) runs until its
// release: arming never replaces it with a gated one, which the node would start anew behind a closed gate, but
// arms the worker's next stand-in beside it; its release arms it in place.
func TestArmingLeavesAStandInThatRunsAlone(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GatesDir: filepath.Join(t.TempDir(), "gates")}
	if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err != nil {
		t.Fatal(err)
	}
	slots := standInSlots("default", "fl-trainer-0")
	file := filepath.Join(dir, slots[0].file)
	before, _ := os.ReadFile(file)
	s.GateBinary, s.Runtime = agentBinary(t), withImages
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(file); string(after) != string(before) {
		t.Error("arming replaced a running stand-in")
	}
	if err := s.Release("default", "fl-trainer-0"); err != nil {
		t.Fatal(err)
	}
	for _, slot := range slots {
		if readArmed(t, filepath.Join(dir, slot.file)).Metadata.Annotations[ArmedAnnotation] == "" {
			t.Errorf("%s not armed after the release", slot.file)
		}
	}
}

// [P-HEAL-3] A worker's stand-ins take two slots: while one stands in, the next is armed in the other, under another
// pod name, and the release arms the first again in place, never removing its file (a node holds every pod's start
// while it deletes an orphaned mirror pod, for minutes when a cut begins meanwhile). A rebuild opens the stand-in
// armed longest (the other may be a pod the node is still making anew), unless a stand-in runs already.
func TestTheNextStandInIsArmedBesideTheOneThatRuns_P_HEAL_3(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GateBinary: agentBinary(t), GatesDir: filepath.Join(t.TempDir(), "gates"), Runtime: withImages}
	slots := standInSlots("default", "fl-trainer-0")
	ctx := context.Background()
	arm := func() {
		if err := s.Arm(context.Background(), workers); err != nil {
			t.Fatal(err)
		}
	}
	rebuild := func() {
		if err := s.Rebuild(ctx, "default", "fl-trainer-0", "u1"); err != nil {
			t.Fatal(err)
		}
	}
	release := func() {
		if err := s.Release("default", "fl-trainer-0"); err != nil {
			t.Fatal(err)
		}
	}
	// state is each slot's content: "" (free), "armed", or "open", with the pod's name.
	state := func() [2]string {
		var out [2]string
		for i, slot := range slots {
			data, err := os.ReadFile(filepath.Join(dir, slot.file))
			if err != nil {
				continue
			}
			var pod struct{ Metadata struct{ Name string } }
			_ = json.Unmarshal(data, &pod)
			out[i] = "armed " + pod.Metadata.Name
			if s.gateOpen(slot.file) {
				out[i] = "open " + pod.Metadata.Name
			}
		}
		return out
	}
	a, b := "fl-trainer-0", "fl-trainer-0-b"
	steps := []struct {
		what      string
		do        func()
		want      [2]string
		rewritten int // the slot the step writes anew, -1 for none
	}{
		{"armed", arm, [2]string{"armed " + a, ""}, -1},
		{"rebuilt", rebuild, [2]string{"open " + a, ""}, -1},
		{"rebuilt again while it stands in", rebuild, [2]string{"open " + a, ""}, -1},
		{"the next armed beside it", arm, [2]string{"open " + a, "armed " + b}, -1},
		{"rebuilt while one stands in and the next is armed", rebuild, [2]string{"open " + a, "armed " + b}, -1},
		{"handed back", release, [2]string{"armed " + a, "armed " + b}, 0},
		{"armed after the hand-back", arm, [2]string{"armed " + a, "armed " + b}, -1},
		{"rebuilt from the slot armed longest", rebuild, [2]string{"armed " + a, "open " + b}, -1},
		{"nothing more to arm", arm, [2]string{"armed " + a, "open " + b}, -1},
		{"handed back again", release, [2]string{"armed " + a, "armed " + b}, 1},
		{"rebuilt from the first slot, armed longest now", rebuild, [2]string{"open " + a, "armed " + b}, -1},
	}
	for _, step := range steps {
		armed := map[string][]byte{}
		for _, slot := range slots {
			armed[slot.file], _ = os.ReadFile(filepath.Join(dir, slot.file))
		}
		time.Sleep(time.Millisecond) // stamps apart
		step.do()
		if got := state(); got != step.want {
			t.Fatalf("%s: slots %q, want %q", step.what, got, step.want)
		}
		for i, slot := range slots {
			now, _ := os.ReadFile(filepath.Join(dir, slot.file))
			if changed := len(armed[slot.file]) > 0 && string(now) != string(armed[slot.file]); changed != (i == step.rewritten) {
				t.Errorf("%s: %s written anew: %v, want %v (the node makes a new pod of it)", step.what, slot.file, changed, i == step.rewritten)
			}
		}
		if got, _ := s.StandIns(); len(got) > 1 {
			t.Errorf("%s: %d stand-ins, want one at most", step.what, len(got))
		}
	}
}

// Without arming (no gate binary) nothing is armed, and a rebuild writes the stand-in as before.
func TestWithoutArmingARebuildWritesTheStandIn(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GatesDir: filepath.Join(t.TempDir(), "gates"), Runtime: withImages}
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Fatalf("armed %v without arming", files)
	}
	if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err != nil {
		t.Fatal(err)
	}
	if pod := readArmed(t, filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file)); len(pod.Spec.Containers[0].Command) != 0 ||
		pod.Metadata.Annotations[ArmedAnnotation] != "" {
		t.Errorf("the rebuild wrote a gated stand-in: %+v", pod)
	}
}

// Each stand-in written is stamped, so no two have one UID (a node takes it from the manifest, and a kubelet starts
// no pod of a UID it ended until it purged it); arming again what is armed already writes nothing.
func TestEachStandInWrittenIsANewPodToTheNode(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GatesDir: filepath.Join(t.TempDir(), "gates")}
	file := filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file)
	var written [][]byte
	for range 2 {
		if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(file)
		written = append(written, data)
		if err := s.Release("default", "fl-trainer-0"); err != nil {
			t.Fatal(err)
		}
	}
	if string(written[0]) == string(written[1]) || string(unstamped(written[0])) != string(unstamped(written[1])) {
		t.Errorf("two rebuilds of one worker:\n%s\n%s\nwant the same pod but for its stamp", written[0], written[1])
	}
}

// [P-HEAL-3] With both slots armed, a rebuild opens the stand-in whose gate edged runs (edged starts a stand-in
// written anew only after it deleted its last version's mirror pod, minutes when a cut began meanwhile), the one
// whose gate ran first when both do; and when the runtime shows neither (or does not answer), the one written first.
func TestARebuildOpensTheStandInWhoseGateEdgedRuns_P_HEAL_3(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GateBinary: agentBinary(t), GatesDir: filepath.Join(t.TempDir(), "gates"), Node: "edge-1", Runtime: withImages}
	ctx := context.Background()
	for _, step := range []func() error{ // slot b armed first, then a armed again in place by its release
		func() error { return s.Arm(context.Background(), workers) },
		func() error { return s.Rebuild(ctx, "default", "fl-trainer-0", "u1") },
		func() error { return s.Arm(context.Background(), workers) },
		func() error { time.Sleep(time.Millisecond); return s.Release("default", "fl-trainer-0") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	slots := standInSlots("default", "fl-trainer-0")
	var written [2]time.Time
	for i, slot := range slots {
		in, _ := readStandIn(filepath.Join(dir, slot.file))
		written[i] = in.written
	}
	if !written[1].Before(written[0]) {
		t.Fatalf("slot b written %v, not before slot a %v", written[1], written[0])
	}
	gate := func(pod string, started time.Time, running bool) cri.Pod {
		return cri.Pod{Namespace: "default", Name: pod + "-edge-1", UID: pod + started.String(),
			Containers: []cri.Container{{Name: "train", Running: running, StartedAt: started}}}
	}
	a, b := slots[0].pod, slots[1].pod
	for _, tc := range []struct {
		name    string
		runtime Runtime
		opens   int
	}{
		{"no runtime: the one written first", nil, 1},
		{"neither gate runs", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(time.Second), false)}}, 1},
		{"only a's gate runs", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(time.Second), true)}}, 0},
		{"both run, b's first", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(time.Second), true), gate(b, written[0].Add(time.Millisecond), true)}}, 1},
		{"a's runs, of the version before it was written again", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(-time.Millisecond), true)}}, 1},
		{"a's runs, an older pod of its name too", runtimeOf{pods: []cri.Pod{gate(a, written[1], true), gate(a, written[0].Add(time.Second), true)}}, 0},
		{"another node's pod of that name", runtimeOf{pods: []cri.Pod{{Namespace: "default", Name: a + "-edge-2",
			Containers: []cri.Container{{Name: "train", Running: true, StartedAt: written[0].Add(time.Second)}}}}}, 1},
		{"the runtime fails", runtimeOf{err: errors.New("deadline exceeded")}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, slot := range slots {
				_ = os.Remove(filepath.Join(s.gateDir(slot.file), gateFile))
			}
			s.Runtime = tc.runtime
			if err := s.Rebuild(ctx, "default", "fl-trainer-0", "u1"); err != nil {
				t.Fatal(err)
			}
			for i, slot := range slots {
				if open := s.gateOpen(slot.file); open != (i == tc.opens) {
					t.Errorf("the gate of %s open %t, want %t", slot.pod, open, i == tc.opens)
				}
			}
		})
	}
}

// An armed stand-in's container runs what the worker's would have, as a node decides it from the container and
// its image; what comes from the image is kept from the node's $(VAR) expansion.
func TestArmedContainerRunsWhatTheWorkersWould(t *testing.T) {
	images := map[string]ImageCommand{"entry": {Entrypoint: []string{"/entry", "$(HOME)"}, Cmd: []string{"serve", "$$x"}},
		"cmd-only": {Cmd: []string{"python", "main.py"}}, "nothing": {}}
	commandOf := func(image string) (ImageCommand, error) {
		if ic, ok := images[image]; ok {
			return ic, nil
		}
		return ImageCommand{}, errors.New("image not on the node")
	}
	for _, tc := range []struct {
		name, container string
		want            []any
		err             bool
	}{
		{"command and args", `{"name":"c","image":"entry","command":["/bin/run"],"args":["-v"]}`, []any{"/bin/run", "-v"}, false},
		{"command alone: the image's Cmd is not used", `{"name":"c","image":"entry","command":["/bin/run"]}`, []any{"/bin/run"}, false},
		{"args alone: the image's entrypoint", `{"name":"c","image":"entry","args":["$(PORT)"]}`, []any{"/entry", "$$(HOME)", "$(PORT)"}, false},
		{"neither: the image's entrypoint and Cmd", `{"name":"c","image":"entry"}`, []any{"/entry", "$$(HOME)", "serve", "$$$$x"}, false},
		{"an image with a Cmd alone", `{"name":"c","image":"cmd-only"}`, []any{"python", "main.py"}, false},
		{"an image that names nothing", `{"name":"c","image":"nothing"}`, nil, true},
		{"an image not on the node", `{"name":"c","image":"missing"}`, nil, true},
		{"a command that is not strings", `{"name":"c","image":"entry","command":[1]}`, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var container map[string]any
			if err := json.Unmarshal([]byte(tc.container), &container); err != nil {
				t.Fatal(err)
			}
			got, err := commandLine(container, commandOf)
			if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
				t.Errorf("command line %q (%v), want %q (error %t)", got, err, tc.want, tc.err)
			}
		})
	}
}

// A worker whose image the node does not have (not pulled yet) is not armed, and Arm says why; a rebuild then
// writes its stand-in, as without arming. Once the image is there it is armed.
func TestAWorkerWhoseImageIsNotOnTheNodeIsArmedOnceItIs(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GateBinary: agentBinary(t), GatesDir: filepath.Join(t.TempDir(), "gates"), Runtime: runtimeOf{}}
	err := s.Arm(context.Background(), workers)
	if err == nil || !strings.Contains(err.Error(), "default/fl-trainer-0") || !strings.Contains(err.Error(), "trainer") {
		t.Errorf("arming a worker whose image is not on the node: %v, want an error naming the worker and the image", err)
	}
	file := filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("armed without the worker's command (%v)", err)
	}
	s.Runtime = withImages
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	if readArmed(t, file).Metadata.Annotations[ArmedAnnotation] == "" {
		t.Error("not armed once the image is on the node")
	}
}

// The gate holds the container's command until the gate file is there, then the command runs in the gate's own
// process (as the container's process, with its environment), found on the PATH.
func TestTheGateRunsTheContainersCommandOnceOpen(t *testing.T) {
	if path := os.Getenv("LIFELINE_TEST_GATE"); path != "" {
		WaitForGate(path, 5*time.Millisecond)
		err := ExecWorker([]string{"sh", "-c", `echo "ran as $$ with $GREETING"`})
		fmt.Println("exec failed:", err)
		os.Exit(1)
	}
	gate := filepath.Join(t.TempDir(), "open")
	cmd := exec.Command(os.Args[0], "-test.run=^TestTheGateRunsTheContainersCommandOnceOpen$")
	cmd.Env = append(os.Environ(), "LIFELINE_TEST_GATE="+gate, "GREETING=hello")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the gate ended before it was opened: %v, %q", err, out.String())
	case <-time.After(300 * time.Millisecond):
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if want := fmt.Sprintf("ran as %d with hello\n", cmd.Process.Pid); err != nil || out.String() != want {
			t.Errorf("the opened gate printed %q (%v), want %q: the command in the gate's process", out.String(), err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not run once the gate was opened")
	}
}

// An armed stand-in's init containers wait at the gate too, before its containers: none runs beside the worker
// (a model's download, a registration) each time a stand-in is armed, and a sidecar among them loses its probes as
// the containers do.
func TestArmedInitContainersWaitAtTheGate(t *testing.T) {
	dir, gates := t.TempDir(), filepath.Join(t.TempDir(), "gates")
	manifest := withSpec(t, "initContainers", `[{"name":"storage-initializer","image":"w","args":["s3://models/m","/models"]},`+
		`{"name":"sidecar","image":"w","command":["/proxy"],"restartPolicy":"Always","readinessProbe":{"tcpSocket":{"port":80}}}]`)
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: manifest}}
	s := &StaticPods{Dir: dir, Workers: workers, GateBinary: agentBinary(t), GatesDir: gates, Runtime: withImages}
	if err := s.Arm(context.Background(), workers); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file))
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Spec struct {
			InitContainers []struct {
				Name           string
				Command, Args  []string
				ReadinessProbe any `json:"readinessProbe"`
			} `json:"initContainers"`
		}
	}
	if err := json.Unmarshal(data, &pod); err != nil {
		t.Fatal(err)
	}
	gate := []string{filepath.Join(gates, ".bin", "lifeline-gate"), "gate", "--path", filepath.Join(s.gateDir(standInSlots("default", "fl-trainer-0")[0].file), "open"), "--"}
	want := map[string][]string{"storage-initializer": append(slices.Clone(gate), "/w", "s3://models/m", "/models"),
		"sidecar": append(slices.Clone(gate), "/proxy")}
	if len(pod.Spec.InitContainers) != len(want) {
		t.Fatalf("init containers %+v, want %d", pod.Spec.InitContainers, len(want))
	}
	for _, c := range pod.Spec.InitContainers {
		if !slices.Equal(c.Command, want[c.Name]) || len(c.Args) != 0 || c.ReadinessProbe != nil {
			t.Errorf("init container %s runs %q %q (probe %v), want %q behind the gate, no probe", c.Name, c.Command, c.Args, c.ReadinessProbe, want[c.Name])
		}
	}
}
