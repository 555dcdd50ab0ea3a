package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
		InitContainers []struct {
			Name, Image     string
			Args            []string
			SecurityContext struct {
				RunAsUser    *int64 `json:"runAsUser"`
				RunAsNonRoot *bool  `json:"runAsNonRoot"`
			} `json:"securityContext"`
		}
		Containers []struct {
			Name      string
			Resources map[string]any
		}
		Volumes []struct {
			Name     string
			HostPath *struct{ Path, Type string }
		}
	}
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
	s := &StaticPods{Dir: dir, Workers: workers, GateImage: "lifeline-agent:1.0", GatesDir: gates, Now: func() time.Time { return now }}
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file)
	pod := readArmed(t, file)
	gate := s.gateDir(standInSlots("default", "fl-trainer-0")[0].file)
	if pod.Metadata.Annotations[ArmedAnnotation] != gate || len(pod.Spec.InitContainers) != 1 ||
		pod.Spec.InitContainers[0].Image != "lifeline-agent:1.0" ||
		!slices.Equal(pod.Spec.InitContainers[0].Args, []string{"gate", "--path", filepath.Join(gate, "open")}) {
		t.Fatalf("armed stand-in %+v, want the gate of %s first", pod, gate)
	}
	// Item 5 of the third hardening round: a stand-in healed offline is held to its worker's memory limit, yet
	// reserves next to nothing beside its worker, and no GPU the worker holds.
	if r := fmt.Sprint(pod.Spec.Containers[0].Resources); r != "map[limits:map[memory:1Gi] requests:map[memory:1Mi]]" {
		t.Errorf("the armed stand-in's resources %s, want its memory limit kept and next to nothing asked for", r)
	}
	if sc := pod.Spec.InitContainers[0].SecurityContext; sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("the gate runs as %+v, want a user that is not root, so a worker that must not run as root is armed", sc)
	}
	mounted := false
	for _, v := range pod.Spec.Volumes {
		mounted = mounted || (v.HostPath != nil && v.HostPath.Path == gate && v.HostPath.Type == "Directory")
	}
	if info, err := os.Stat(gate); err != nil || !info.IsDir() || !mounted || filepath.Dir(gate) != gates {
		t.Errorf("the gate directory %s (%v) is not there, or not mounted", gate, err)
	}
	if _, err := os.Stat(filepath.Join(dir, standInSlots("default", "w")[0].file)); !os.IsNotExist(err) {
		t.Errorf("a worker whose offline policy is None was armed (%v)", err)
	}
	if got, _ := s.StandIns(); len(got) != 0 {
		t.Fatalf("stand-ins %v behind a closed gate", got)
	}
	before, _ := os.ReadFile(file)
	if err := s.Arm(workers); err != nil {
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
	if err := s.Arm(fixedWorkers{}); err != nil { // the trainer's pod is gone from the API server: its stand-in runs on
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
	if err := s.Arm(workers); err != nil {
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
		if err := s.Arm(step.workers); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(file); step.kept != (err == nil) || (step.kept && string(got) != string(armed)) {
			t.Fatalf("%d workers, %v later: the armed stand-in kept as it was %t (%v), want %t", len(step.workers), step.after, err == nil, err, step.kept)
		}
	}
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	s.GateImage = "" // arming turned off: the closed stand-ins go, after the grace too
	for _, after := range []time.Duration{0, DepartureGrace} {
		now = now.Add(after)
		if err := s.Arm(workers); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("an armed stand-in outlived arming (%v)", err)
	}
	s.GateImage = "lifeline-agent:1.0"
	if err := s.Arm(workers); err != nil {
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
	s.GateImage = "lifeline-agent:1.0"
	if err := s.Arm(workers); err != nil {
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
	s := &StaticPods{Dir: dir, Workers: workers, GateImage: "lifeline-agent:1.0", GatesDir: filepath.Join(t.TempDir(), "gates")}
	slots := standInSlots("default", "fl-trainer-0")
	ctx := context.Background()
	arm := func() {
		if err := s.Arm(workers); err != nil {
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

// Without a gate image nothing is armed, and a rebuild writes the stand-in as before.
func TestWithoutAGateImageARebuildWritesTheStandIn(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GatesDir: filepath.Join(t.TempDir(), "gates")}
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Fatalf("armed %v without a gate image", files)
	}
	if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err != nil {
		t.Fatal(err)
	}
	if pod := readArmed(t, filepath.Join(dir, standInSlots("default", "fl-trainer-0")[0].file)); len(pod.Spec.InitContainers) != 0 ||
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

// runtimeOf answers what a node's runtime has.
type runtimeOf struct {
	pods []cri.Pod
	err  error
}

func (r runtimeOf) Pods(context.Context) ([]cri.Pod, error) { return r.pods, r.err }

// [P-HEAL-3] With both slots armed, a rebuild opens the stand-in whose gate edged runs (edged starts a stand-in
// written anew only after it deleted its last version's mirror pod, minutes when a cut began meanwhile), the one
// whose gate ran first when both do; and when the runtime shows neither (or does not answer), the one written first.
func TestARebuildOpensTheStandInWhoseGateEdgedRuns_P_HEAL_3(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GateImage: "lifeline-agent:1.0", GatesDir: filepath.Join(t.TempDir(), "gates"), Node: "edge-1"}
	ctx := context.Background()
	for _, step := range []func() error{ // slot b armed first, then a armed again in place by its release
		func() error { return s.Arm(workers) },
		func() error { return s.Rebuild(ctx, "default", "fl-trainer-0", "u1") },
		func() error { return s.Arm(workers) },
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
			Containers: []cri.Container{{Name: gateContainer, Running: running, StartedAt: started}}}
	}
	a, b := slots[0].pod, slots[1].pod
	for _, tc := range []struct {
		name    string
		runtime RuntimePods
		opens   int
	}{
		{"no runtime: the one written first", nil, 1},
		{"neither gate runs", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(time.Second), false)}}, 1},
		{"only a's gate runs", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(time.Second), true)}}, 0},
		{"both run, b's first", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(time.Second), true), gate(b, written[0].Add(time.Millisecond), true)}}, 1},
		{"a's runs, of the version before it was written again", runtimeOf{pods: []cri.Pod{gate(a, written[0].Add(-time.Millisecond), true)}}, 1},
		{"a's runs, an older pod of its name too", runtimeOf{pods: []cri.Pod{gate(a, written[1], true), gate(a, written[0].Add(time.Second), true)}}, 0},
		{"another node's pod of that name", runtimeOf{pods: []cri.Pod{{Namespace: "default", Name: a + "-edge-2",
			Containers: []cri.Container{{Name: gateContainer, Running: true, StartedAt: written[0].Add(time.Second)}}}}}, 1},
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
