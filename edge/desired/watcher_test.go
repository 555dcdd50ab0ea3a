package desired

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// run runs w until the test ends, and waits for it to stop before the test's directories are removed.
func run(t *testing.T, w *Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, 20*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// podJSON is a worker pod as an API server sends it.
func podJSON(name, node, restartPolicy string) string {
	return fmt.Sprintf(`{"metadata":{"namespace":"default","name":%q,"uid":"uid-%s","labels":{%q:"edge"}},`+
		`"spec":{"nodeName":%q,"restartPolicy":%q,"containers":[{"name":"main","image":"w"}]}}`,
		name, name, lifelinev1.RoleLabel, node, restartPolicy)
}

func decodePod(t *testing.T, s string) Pod {
	t.Helper()
	var p Pod
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// kubeEdgeStore answers as KubeEdge's MetaServer does: connected, it forwards to cloudcore and lists every
// node's pods whatever the field selector says (the worst a forwarder can do); cut off, its local store
// matches metadata fields only, so a spec.nodeName selector lists nothing. Watches send the events given.
type kubeEdgeStore struct {
	cutOff bool
	pods   []Pod
	events chan Event

	mu        sync.Mutex
	selectors []Selector
}

func (s *kubeEdgeStore) List(_ context.Context, sel Selector, each func(*Pod)) (string, error) {
	s.mu.Lock()
	s.selectors = append(s.selectors, sel)
	s.mu.Unlock()
	if s.cutOff && strings.Contains(sel.Fields, "spec.nodeName") {
		return "", nil
	}
	for i := range s.pods {
		each(&s.pods[i])
	}
	return "", nil
}

func (s *kubeEdgeStore) Watch(ctx context.Context, _ Selector, _ string) (<-chan Event, error) {
	out := make(chan Event)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-s.events:
				out <- ev
			}
		}
	}()
	return out, nil
}

func (s *kubeEdgeStore) sent() []Selector {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Selector(nil), s.selectors...)
}

// A connected MetaServer forwards the list to cloudcore, which answers with every node's pods: the pods of
// other nodes, listed or watched, are never taken as this node's workers, and the field selector is still sent.
func TestWatcherIgnoresOtherNodesPodsFromAnUnscopedMetaServer(t *testing.T) {
	store := &kubeEdgeStore{events: make(chan Event),
		pods: []Pod{decodePod(t, podJSON("mine", "edge-1", "")), decodePod(t, podJSON("theirs", "edge-2", ""))}}
	w, err := New(store, "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	testkit.Until(t, waitLimit, "the node's worker listed", func() bool { return w.Reachable() && names(w.Workers()) == "default/mine() " })
	store.events <- Event{Type: "ADDED", Pod: decodePod(t, podJSON("theirs-too", "edge-2", ""))}
	store.events <- Event{Type: "ADDED", Pod: decodePod(t, podJSON("mine-too", "edge-1", ""))}
	testkit.Until(t, waitLimit, "the node's new worker watched", func() bool { return w.HasWorker("default", "mine-too") })
	if got := names(w.Workers()); got != "default/mine() default/mine-too() " {
		t.Errorf("workers %q, want only edge-1's", got)
	}
	if w.HasWorker("default", "theirs") || w.Has("uid-theirs-too") {
		t.Error("another node's pod taken as a worker")
	}
	if sel := store.sent()[0]; sel.Fields != "spec.nodeName=edge-1" || sel.Labels != lifelinev1.RoleLabel {
		t.Errorf("selector %+v, want the node's field selector and the role label", sel)
	}
}

// An agent that starts on a cut-off KubeEdge node with an empty state directory still learns its workers: its
// MetaServer's local store lists nothing for a spec.nodeName field selector, so the label selector is tried
// alone, and the answer is filtered by node here.
func TestWatcherLearnsWorkersWhileCutOffFromAStoreWithoutFieldSelectors(t *testing.T) {
	store := &kubeEdgeStore{cutOff: true, events: make(chan Event),
		pods: []Pod{decodePod(t, podJSON("mine", "edge-1", "OnFailure")), decodePod(t, podJSON("theirs", "edge-2", ""))}}
	w, err := New(store, "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	testkit.Until(t, waitLimit, "the node's worker from the local store", func() bool { return names(w.Workers()) == "default/mine() " })
	store.events <- Event{Type: "ADDED", Pod: decodePod(t, podJSON("theirs-too", "edge-2", ""))}
	store.events <- Event{Type: "ADDED", Pod: decodePod(t, podJSON("mine-too", "edge-1", ""))}
	testkit.Until(t, waitLimit, "the node's new worker watched", func() bool { return w.HasWorker("default", "mine-too") })
	if w.HasWorker("default", "theirs-too") {
		t.Error("another node's pod taken as a worker")
	}
	if got := w.Workers()[0].RestartPolicy; got != "OnFailure" {
		t.Errorf("restart policy %q, want the pod's OnFailure", got)
	}
}

// A mirror pod (the API server's copy of a static pod of the node, such as the agent's stand-in for a worker, whose
// labels it carries) is no worker, nor is a stand-in as a node may list it: the node runs them from its
// manifests, and the agent must not report them lost, nor hand a stand-in back because it runs.
func TestMirrorPodIsNoWorker(t *testing.T) {
	mirror := strings.Replace(podJSON("w-edge-1", "edge-1", ""), `"labels"`,
		`"annotations":{"kubernetes.io/config.mirror":"8ca8cad6"},"labels"`, 1)
	store := &kubeEdgeStore{events: make(chan Event), pods: []Pod{decodePod(t, podJSON("w", "edge-1", "")), decodePod(t, mirror)}}
	w, err := New(store, "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	testkit.Until(t, waitLimit, "the node's worker listed", func() bool { return w.Reachable() && w.HasWorker("default", "w") })
	standIn := strings.Replace(podJSON("w-edge-1-x", "edge-1", ""), `"labels"`,
		`"annotations":{"`+lifelinev1.StaticPodOfAnnotation+`":"default/w"},"labels"`, 1)
	store.events <- Event{Type: "ADDED", Pod: decodePod(t, standIn)}
	store.events <- Event{Type: "MODIFIED", Pod: decodePod(t, mirror)}
	store.events <- Event{Type: "ADDED", Pod: decodePod(t, podJSON("next", "edge-1", ""))}
	testkit.Until(t, waitLimit, "the next event seen", func() bool { return w.HasWorker("default", "next") })
	if w.HasWorker("default", "w-edge-1") {
		t.Error("a mirror pod taken as a worker")
	}
	if w.HasWorker("default", "w-edge-1-x") {
		t.Error("the agent's stand-in, as a node lists its static pods, taken as a worker")
	}
}

// A pod that does not say its restart policy has the API's default, Always.
func TestWorkerRestartPolicyDefaultsToAlways(t *testing.T) {
	p := decodePod(t, podJSON("w", "edge-1", ""))
	if got := toWorker(&p).RestartPolicy; got != RestartAlways {
		t.Errorf("restart policy %q, want %q", got, RestartAlways)
	}
}

// A desired-workers.json that does not decode (torn by a crash, a full disk) no longer stops the agent at every
// start: it is moved aside, kept for inspection, and the agent starts with no workers.
func TestCorruptDesiredWorkersFileIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "desired-workers.json")
	if err := os.WriteFile(path, []byte(`[{"namespace":"default","na`), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := New(&kubeEdgeStore{}, "edge-1", dir, logr.Discard())
	if err != nil {
		t.Fatalf("the agent would not start: %v", err)
	}
	if len(w.Workers()) != 0 {
		t.Errorf("workers %v from a corrupt file", w.Workers())
	}
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if _, err := os.Stat(path); !os.IsNotExist(err) || len(aside) != 1 {
		t.Fatalf("file still in place (%v) or not moved aside (%v)", err, aside)
	}
	if data, _ := os.ReadFile(aside[0]); string(data) != `[{"namespace":"default","na` {
		t.Errorf("moved-aside file holds %q", data)
	}
}

// A projected service-account token is rotated in place: the client reads the token file for every request,
// so the rotated token is used, not refused.
func TestRotatedServiceAccountTokenIsReadForEveryRequest(t *testing.T) {
	var current atomic.Value
	current.Store("token-1")
	api := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+current.Load().(string) {
			http.Error(rw, "Unauthorized", http.StatusUnauthorized)
			return
		}
		_, _ = rw.Write([]byte(`{"metadata":{"resourceVersion":"1"},"items":[` + podJSON("w", "edge-1", "") + `]}`))
	}))
	defer api.Close()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: agent
contexts: [{name: agent, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "`+api.URL+`"}}]
users: [{name: u, user: {tokenFile: token}}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := PodClientFromKubeconfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.List(ctx, Selector{}, func(*Pod) {}); err != nil {
		t.Fatal(err)
	}
	// The kubelet rotates the token: the file changes, and the API server accepts only the new one.
	current.Store("token-2")
	if err := os.WriteFile(tokenFile, []byte("token-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listed := 0
	if _, err := client.List(ctx, Selector{}, func(*Pod) { listed++ }); err != nil || listed != 1 {
		t.Fatalf("after the token was rotated: %v", err)
	}
}

// An API server that answers 401 or 403 is reached: the node is not cut off (its workers are not healed
// locally), and its workers are kept.
func TestRefusingAPIServerIsReachableNotCutOff(t *testing.T) {
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			api := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
				http.Error(rw, "no", code)
			}))
			defer api.Close()
			dir := t.TempDir()
			known, _ := json.Marshal([]Worker{{Namespace: "default", Name: "w", UID: "u"}})
			if err := os.WriteFile(filepath.Join(dir, "desired-workers.json"), known, 0o600); err != nil {
				t.Fatal(err)
			}
			w, err := New(NewPodClient(api.URL, nil, "stale"), "edge-1", dir, logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			run(t, w)
			testkit.Until(t, waitLimit, "the refusing API server taken as reachable", w.Reachable)
			if !w.HasWorker("default", "w") {
				t.Error("the workers were dropped")
			}
		})
	}
}

// A JI edge worker reports under its Deployment's name (its WORKER_NAME), not its pod's: the report API must
// recognise it by that name, and only on the node the pod is bound to.
func TestWorkerIsKnownByItsWorkerName(t *testing.T) {
	ji := `{"metadata":{"namespace":"default","name":"helmet-edge-7d9f-x2x","uid":"uid-ji","labels":{%q:"edge"}},` +
		`"spec":{"nodeName":%q,"containers":[{"name":"main","image":"w","env":[{"name":"WORKER_NAME","value":"helmet-edge"}]}]}}`
	store := &kubeEdgeStore{events: make(chan Event), pods: []Pod{decodePod(t, fmt.Sprintf(ji, lifelinev1.RoleLabel, "edge-1"))}}
	w, err := New(store, "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	testkit.Until(t, waitLimit, "the JI worker listed", func() bool { return w.Has("uid-ji") })
	for name, want := range map[string]bool{"helmet-edge": true, "helmet-edge-7d9f-x2x": true, "helmet": false} {
		if got := w.HasWorker("default", name); got != want {
			t.Errorf("HasWorker(default, %q) = %v, want %v", name, got, want)
		}
	}
	if w.HasWorker("other", "helmet-edge") {
		t.Error("a worker name taken in another namespace")
	}
}

// A watch begun as the link is cut (the server silent once the connection is made) fails within connectTimeout:
// the watcher then says the API server is out of reach and tries again, instead of waiting on TCP's retries.
func TestWatchOnASilentLinkFailsWithinTheConnectTimeout(t *testing.T) {
	defer func(d time.Duration) { connectTimeout = d }(connectTimeout)
	connectTimeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn // accepted, never answered, closed with the listener
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	pods := NewPodClient("https://"+ln.Addr().String(), &tls.Config{InsecureSkipVerify: true}, "") //nolint:gosec // no server to check
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := pods.Watch(ctx, Selector{}, "1"); err == nil || ctx.Err() != nil {
		t.Fatalf("the watch on a silent link: %v; want an error before the test's own deadline", err)
	}
}
