package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// A tenant binds twenty pods of about a megabyte each (a 250 KB annotation and a 700 KB environment value, within
// the API server's limits) to a node, labelled as workers. The agent lists and watches them from the real API
// server and keeps of each what it keeps of any worker but its manifest: they are reported, get no stand-in, and
// say why; the node's own worker keeps its manifest; the agent holds and saves kilobytes, not the tenant's 20 MB.
func TestTenantPodsOfAMegabyteEachCostTheirWorkersTheirStandInsNotTheAgent(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(controlPlane.Config)
	ns := "tenant-bloat"
	makeNamespace(t, admin, ns)
	const node = "edge-bloat"
	create := func(name string, bloat bool) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{contract.RoleLabel: "edge"},
			Annotations: map[string]string{contract.OfflinePolicyAnnotation: "Restart"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "w",
				Env: []corev1.EnvVar{{Name: "WORKER_NAME", Value: name}}}}}}
		if bloat {
			p.Annotations["example.com/blob"] = strings.Repeat("a", 250_000)
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "BLOB", Value: strings.Repeat("b", 700_000)})
		}
		if _, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
	}
	create("own-worker", false)
	for i := range 20 {
		create(fmt.Sprintf("bloat-%d", i), true)
	}
	client, err := PodClientFromKubeconfig(controlPlane.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	w, err := New(client, node, stateDir, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	testkit.Until(t, waitLimit, "the node's 21 workers listed", func() bool { return w.Reachable() && len(w.Workers()) == 21 })
	create("bloat-20", true) // one more, seen by the watch
	testkit.Until(t, waitLimit, "the watched one", func() bool { return w.HasWorker(ns, "bloat-20") })

	for _, wk := range w.Workers() {
		switch {
		case wk.Name == "own-worker" && (wk.Manifest == "" || wk.ManifestRefused != ""):
			t.Errorf("the node's own worker lost its manifest: %q", wk.ManifestRefused)
		case wk.Name != "own-worker" && (wk.Manifest != "" || !strings.Contains(wk.ManifestRefused, "beyond the agent's bound")):
			t.Errorf("%s: manifest of %d bytes kept, refusal %q", wk.Name, len(wk.Manifest), wk.ManifestRefused)
		case wk.WorkerName != wk.Name || wk.OfflinePolicy != "Restart":
			t.Errorf("%s: the marks the agent reads are lost: %+v", wk.Name, wk)
		}
	}
	if got := w.Oversized(); got != 21 {
		t.Errorf("Oversized() = %d, want the tenant's 21 pods", got)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if held := int64(after.HeapAlloc) - int64(before.HeapAlloc); held > 4<<20 {
		t.Errorf("the watcher holds %d bytes after reading the tenant's pods, want under 4 MiB", held)
	}
	runtime.KeepAlive(w)
	info, err := os.Stat(filepath.Join(stateDir, "desired-workers.json"))
	if err != nil || info.Size() > 64<<10 {
		t.Errorf("saved file: %v, %v bytes; want under 64 KiB", err, info.Size())
	}
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// repeatedReader yields prefix, then n bytes of b, then suffix, holding none of it.
func repeatedReader(prefix string, b byte, n int64, suffix string) io.Reader {
	return io.MultiReader(strings.NewReader(prefix), io.LimitReader(byteReader(b), n), strings.NewReader(suffix))
}

type byteReader byte

func (b byteReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// The 19 MiB desired-workers.json an earlier agent saved of a tenant's pods outlives them: the agent reads it up
// to its bound, keeps the workers found there without their manifests, and starts.
func TestSavedFileOfATenantsPodsIsReadOnlyUpToTheBound(t *testing.T) {
	var saved []string
	for i := range 19 {
		manifest := `{"spec":{"containers":[{"env":[{"name":"BLOB","value":"` + strings.Repeat("b", 1<<20) + `"}]}]}}`
		record, err := json.Marshal(Worker{Namespace: "t", Name: fmt.Sprintf("bloat-%d", i), UID: fmt.Sprintf("u%d", i), Manifest: manifest})
		if err != nil {
			t.Fatal(err)
		}
		saved = append(saved, string(record))
	}
	file := "[" + strings.Join(saved, ",") + "]"
	counted := &countingReader{r: strings.NewReader(file)}
	list, err := readSaved(counted)
	if !errors.Is(err, errSavedTooLarge) {
		t.Fatalf("reading a %d-byte file: %v, want errSavedTooLarge", len(file), err)
	}
	if counted.n > maxSavedBytes {
		t.Errorf("read %d bytes of the file, bound %d", counted.n, maxSavedBytes)
	}
	if len(list) == 0 || len(list) >= 19 {
		t.Errorf("kept %d workers, want those within the bound", len(list))
	}
	for _, wk := range list {
		if wk.Manifest != "" || wk.ManifestRefused == "" {
			t.Errorf("%s: a manifest of %d bytes kept", wk.Name, len(wk.Manifest))
		}
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "desired-workers.json")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := New(&kubeEdgeStore{}, "edge-1", dir, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if got := len(w.Workers()); got != len(list) || w.Oversized() != got {
		t.Errorf("the agent starts with %d workers (%d oversized), want %d", got, w.Oversized(), len(list))
	}
}

// A pod source that sends a pod larger than any API server would (a process answering at the MetaServer's
// address) fails the list after reading at most MaxPodBytes of it, with an error that says so.
func TestAPodBeyondWhatAnAPIServerSendsFailsTheListWithinTheBound(t *testing.T) {
	body := &countingReader{r: repeatedReader(`{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"annotations":{"a":"`, 'x', 64<<20, `"}}}]}`)}
	_, err := decodePodList(body, func(*Pod) { t.Error("a pod beyond the bound was decoded") })
	if !errors.Is(err, errObjectTooLarge) {
		t.Errorf("err = %v, want errObjectTooLarge", err)
	}
	if body.n > MaxPodBytes+64<<10 {
		t.Errorf("read %d bytes, bound %d", body.n, MaxPodBytes)
	}
}

// A list is decoded item by item, whatever the order of its fields, and each pod keeps only the marks the agent
// reads.
func TestPodListIsDecodedItemByItemKeepingOnlyTheMarksTheAgentReads(t *testing.T) {
	list := `{"kind":"PodList","items":[` + podJSON("a", "edge-1", "Never") + `,{"metadata":{"name":"b","labels":{"app":"x","lifeline.sedna.io/role":"edge"},` +
		`"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}","lifeline.sedna.io/offline-policy":"Restart"}},` +
		`"spec":{"nodeName":"edge-1","containers":[{"name":"c","env":[{"name":"HOME","value":"/"},{"name":"WORKER_NAME","value":"b-w"}]}]}}` +
		`],"metadata":{"resourceVersion":"42"}}`
	var pods []Pod
	rv, err := decodePodList(strings.NewReader(list), func(p *Pod) { pods = append(pods, *p) })
	if err != nil || rv != "42" || len(pods) != 2 {
		t.Fatalf("decoded %d pods at %q: %v", len(pods), rv, err)
	}
	b := pods[1]
	if len(b.Metadata.Labels) != 1 || len(b.Metadata.Annotations) != 1 || WorkerNameOf(&b) != "b-w" || len(b.Spec.Containers[0].Env) != 1 {
		t.Errorf("kept labels %v, annotations %v, env %v", b.Metadata.Labels, b.Metadata.Annotations, b.Spec.Containers[0].Env)
	}
	if !strings.Contains(b.Manifest, `"app":"x"`) || !strings.Contains(b.Manifest, "HOME") {
		t.Errorf("the manifest lost the pod's own marks: %s", b.Manifest)
	}
	if _, err := decodePodList(strings.NewReader(`{"items":null,"metadata":{"resourceVersion":"7"}}`), func(*Pod) {}); err != nil {
		t.Errorf("an empty list: %v", err)
	}
}

// When the node's workers together are beyond MaxDesiredBytes, the largest manifests go first: a tenant's large
// pods lose their stand-ins, the node's other workers keep theirs.
func TestDesiredSetBeyondTheBoundDropsTheLargestManifestsFirst(t *testing.T) {
	cases := []struct {
		name              string
		small, large      int // how many workers of 4 KiB and of 120 KiB manifests
		wantLargeRefused  int
		wantSmallRefused  int
		wantDroppedRecord int
	}{
		{name: "within the bound", small: 10, large: 30},
		{name: "the large ones beyond it", small: 100, large: 40, wantLargeRefused: 10},
		{name: "many small ones", small: 1000, large: 10, wantLargeRefused: 10, wantSmallRefused: 46},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			workers := map[string]Worker{}
			add := func(prefix string, n, size int) {
				for i := range n {
					uid := fmt.Sprintf("%s-%d", prefix, i)
					workers[uid] = Worker{Namespace: "t", Name: uid, UID: uid, Manifest: strings.Repeat("m", size)}
				}
			}
			add("small", tc.small, 4<<10)
			add("large", tc.large, 120<<10)
			dropped := bound(workers)
			refused := map[string]int{}
			total := 0
			for uid, wk := range workers {
				total += recordBytes(wk)
				if wk.ManifestRefused != "" {
					refused[strings.Split(uid, "-")[0]]++
				}
			}
			if dropped != tc.wantDroppedRecord || refused["large"] != tc.wantLargeRefused || refused["small"] != tc.wantSmallRefused {
				t.Errorf("dropped %d, refused %v; want %d, large %d, small %d", dropped, refused, tc.wantDroppedRecord, tc.wantLargeRefused, tc.wantSmallRefused)
			}
			if total > MaxDesiredBytes {
				t.Errorf("%d bytes kept, bound %d", total, MaxDesiredBytes)
			}
		})
	}
}
