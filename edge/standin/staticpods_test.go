package standin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/desired"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

func manifestOf(namespace, name string) string {
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"` + namespace + `","name":"` + name +
		`"},"spec":{"containers":[{"name":"main","image":"w"}]}}`
}

// [P-HEAL-3] Two workers whose namespace and name joined by a dash read the same (team-a/trainer and
// team/a-trainer) are rebuilt into two files, each holding its own worker, marked as the agent's.
func TestStaticPodsOfLookalikeWorkersDoNotShareAFile_P_HEAL_3(t *testing.T) {
	dir := t.TempDir()
	s := &StaticPods{Dir: dir, Workers: fixedWorkers{
		{Namespace: "team-a", Name: "trainer", UID: "u1", Manifest: manifestOf("team-a", "trainer")},
		{Namespace: "team", Name: "a-trainer", UID: "u2", Manifest: manifestOf("team", "a-trainer")},
	}}
	for _, uid := range []string{"u1", "u2"} {
		if err := s.Rebuild(context.Background(), "", "", uid); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 2 {
		t.Fatalf("files %v, want one per worker", files)
	}
	var got []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pod struct {
			Metadata struct {
				Namespace, Name string
				Annotations     map[string]string
			}
		}
		if err := json.Unmarshal(data, &pod); err != nil {
			t.Fatal(err)
		}
		if mark := pod.Metadata.Annotations[lifelinev1.StaticPodOfAnnotation]; mark != pod.Metadata.Namespace+"/"+pod.Metadata.Name {
			t.Errorf("%s: marked %q", f, mark)
		}
		got = append(got, pod.Metadata.Namespace+"/"+pod.Metadata.Name)
	}
	sort.Strings(got)
	if got[0] != "team-a/trainer" || got[1] != "team/a-trainer" {
		t.Errorf("static pods %v, want both workers", got)
	}
}

// [P-HEAL-3] The stand-ins are the static pods the agent wrote, each with the pod it stands in for and its
// WORKER_NAME; Release removes one of them and nothing else in the node's directory: not an operator's static
// pod that happens to be named lifeline-*.json, nor one that copies the agent's mark under another name.
func TestStandInsAreOnlyTheStaticPodsTheAgentWrote_P_HEAL_3(t *testing.T) {
	dir := t.TempDir()
	trainer := `{"metadata":{"name":"t","namespace":"default"},"spec":{"containers":[{"name":"c","image":"i",` +
		`"env":[{"name":"WORKER_NAME","value":"job-trainworker-0"}]}]}}`
	s := &StaticPods{Dir: dir, Workers: fixedWorkers{{Namespace: "default", Name: "w", UID: "u", Manifest: manifestOf("default", "w")},
		{Namespace: "default", Name: "t", UID: "ut", Manifest: trainer}}}
	for _, w := range []struct{ name, uid string }{{"w", "u"}, {"t", "ut"}} {
		if err := s.Rebuild(context.Background(), "default", w.name, w.uid); err != nil {
			t.Fatal(err)
		}
	}
	theirs := map[string]string{
		"lifeline-copied.json":  `{"metadata":{"name":"w","annotations":{"` + lifelinev1.StaticPodOfAnnotation + `":"default/w"}}}`,
		"lifeline-garbage.json": "not json",
		"kube-proxy.json":       manifestOf("kube-system", "kube-proxy"),
	}
	for name, content := range theirs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.StandIns()
	want := []core.StandIn{{Namespace: "default", Pod: "t", WorkerName: "job-trainworker-0"}, {Namespace: "default", Pod: "w"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("stand-ins %+v (%v), want %+v", got, err, want)
	}
	for _, pod := range []string{"w", "copied", "kube-proxy"} {
		if err := s.Release("default", pod); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := s.StandIns(); !slices.Equal(got, want[:1]) {
		t.Errorf("stand-ins after releasing w: %+v, want the trainer's alone", got)
	}
	for name := range theirs {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s, not the agent's, was removed: %v", name, err)
		}
	}
}

type fixedWorkers []desired.Worker

func (f fixedWorkers) Workers() []desired.Worker { return f }
