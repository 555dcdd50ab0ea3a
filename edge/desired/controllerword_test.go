package desired

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// session is a broker session the test opens and closes.
type session struct {
	mu       sync.Mutex
	birthSeq uint64
	up       bool
}

func (s *session) now() (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.birthSeq, s.up
}

func (s *session) set(birthSeq uint64, up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.birthSeq, s.up = birthSeq, up
}

// staticJSON is a worker's manifest as the controller sends it: its pod without the node.
func staticJSON(name, restartPolicy string) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"default","name":%q,"labels":{%q:"trainer"},`+
		`"annotations":{%q:"None"}},"spec":{"restartPolicy":%q,"containers":[{"name":"main","image":"w","env":[{"name":"WORKER_NAME","value":%q}]}]}}`,
		name, lifelinev1.RoleLabel, lifelinev1.OfflinePolicyAnnotation, restartPolicy, name)
}

func desiredPayload(t *testing.T, set *lifelinev1.DesiredWorkers) []byte {
	t.Helper()
	out, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// [P-DES-1] [P-DES-2]: the controller's word is the node's workers while its session is up; a set of another
// node's or another session's, or no newer than the last, is refused and counted; the workers outlive the session
// (the node is cut off: nothing was deleted).
func TestControllerWordIsTheWorkersOfTheCurrentSessionsNewestSet(t *testing.T) {
	sess := &session{birthSeq: 3, up: true}
	word := &ControllerWord{Node: "edge-1", Session: sess.now, Poll: 10 * time.Millisecond}
	w, err := New(word, "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	first := &lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 3, Revision: 10, Workers: []*lifelinev1.DesiredWorker{
		{PodUid: "uid-a", Manifest: staticJSON("a", "Never"), Started: true}}}
	if err := word.Offer(3, desiredPayload(t, first)); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, waitLimit, "the set's worker", func() bool { return w.Reachable() && len(w.Workers()) == 1 })
	a := w.Workers()[0]
	if a.UID != "uid-a" || a.Name != "a" || a.WorkerName != "a" || a.RestartPolicy != "Never" || !a.Started ||
		a.OfflinePolicy != lifelinev1.OfflinePolicyNone || !strings.Contains(a.Manifest, `"image":"w"`) || strings.Contains(a.Manifest, "nodeName") {
		t.Errorf("worker %+v: want the manifest's pod, started, with its manifest", a)
	}

	refusals := []struct {
		reason   string
		birthSeq uint64
		set      *lifelinev1.DesiredWorkers
	}{
		{"forged", 3, &lifelinev1.DesiredWorkers{Node: "edge-2", BirthSeq: 3, Revision: 11}},
		{"replayed", 3, &lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 2, Revision: 11}},
		{"replayed", 3, &lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 3, Revision: 10}},
		{"decode", 3, &lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 3, Revision: 12,
			Workers: []*lifelinev1.DesiredWorker{{PodUid: "uid-x", Manifest: []byte("{not json")}}}},
	}
	refusedFor := func(err error) string {
		var refused *RefusedSetError
		if !errors.As(err, &refused) {
			return fmt.Sprintf("not refused (%v)", err)
		}
		return refused.Reason
	}
	for _, r := range refusals {
		if got := refusedFor(word.Offer(r.birthSeq, desiredPayload(t, r.set))); got != r.reason {
			t.Errorf("set %v: %s, want refused as %s", r.set, got, r.reason)
		}
	}
	if got := refusedFor(word.Offer(3, make([]byte, lifelinev1.MaxDesiredPayloadBytes+1))); got != "too-large" {
		t.Errorf("a set beyond the bound: %s", got)
	}

	second := &lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 3, Revision: 20, Workers: []*lifelinev1.DesiredWorker{
		{PodUid: "uid-b", Manifest: staticJSON("b", "Always"), ManifestBytes: 200 << 10}}}
	if err := word.Offer(3, desiredPayload(t, second)); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, waitLimit, "the newer set's worker alone", func() bool {
		ws := w.Workers()
		return len(ws) == 1 && ws[0].UID == "uid-b"
	})
	if b := w.Workers()[0]; b.Manifest != "" || b.ManifestRefused == "" {
		t.Errorf("a worker whose manifest the controller left out: manifest %q, refused %q", b.Manifest, b.ManifestRefused)
	}

	sess.set(3, false)
	testkit.Until(t, waitLimit, "the source unreachable once the session ended", func() bool { return !w.Reachable() })
	if ws := w.Workers(); len(ws) != 1 || ws[0].UID != "uid-b" {
		t.Errorf("workers after the session ended: %v, want uid-b kept", names(ws))
	}
	sess.set(4, true)
	if err := word.Offer(3, desiredPayload(t, &lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 3, Revision: 30})); err != nil {
		t.Fatal(err) // taken: it arrived in session 3; but session 4 is up, so it is not the word
	}
	if _, err := word.List(t.Context(), Selector{}, func(*Pod) {}); err == nil {
		t.Error("the old session's set listed in the new session")
	}
}
