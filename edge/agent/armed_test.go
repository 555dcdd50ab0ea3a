package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
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
	s := &StaticPods{Dir: dir, Workers: workers, GateImage: "lifeline-agent:1.0", GatesDir: gates}
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, staticPodFile("default", "fl-trainer-0"))
	pod := readArmed(t, file)
	gate := s.gateDir(staticPodFile("default", "fl-trainer-0"))
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
	if _, err := os.Stat(filepath.Join(dir, staticPodFile("default", "w"))); !os.IsNotExist(err) {
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
	if _, err := os.Stat(gate); !os.IsNotExist(err) {
		t.Errorf("the gate outlived its release (%v)", err)
	}
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(gate, "open")); !os.IsNotExist(err) || readArmed(t, file).Metadata.Annotations[ArmedAnnotation] != gate {
		t.Error("not armed again, closed, after the release")
	}
	if err := s.Arm(fixedWorkers{kept}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the armed stand-in of a worker gone is still there (%v)", err)
	}
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	s.GateImage = "" // arming turned off: the closed stand-ins go
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
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
// release: arming never replaces it with a gated one, which the node would start anew behind a closed gate.
func TestArmingLeavesAStandInThatRunsAlone(t *testing.T) {
	dir := t.TempDir()
	workers := fixedWorkers{{Namespace: "default", Name: "fl-trainer-0", UID: "u1", Manifest: renderedTrainer}}
	s := &StaticPods{Dir: dir, Workers: workers, GatesDir: filepath.Join(t.TempDir(), "gates")}
	if err := s.Rebuild(context.Background(), "default", "fl-trainer-0", "u1"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, staticPodFile("default", "fl-trainer-0"))
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
	if err := s.Arm(workers); err != nil {
		t.Fatal(err)
	}
	if readArmed(t, file).Metadata.Annotations[ArmedAnnotation] == "" {
		t.Error("not armed after the release")
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
	if pod := readArmed(t, filepath.Join(dir, staticPodFile("default", "fl-trainer-0"))); len(pod.Spec.InitContainers) != 0 ||
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
	file := filepath.Join(dir, staticPodFile("default", "fl-trainer-0"))
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
