package reportapi

import (
	"context"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

func TestCountSamplesAsSednasLC(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name, content, format string
		maxBytes              int64
		ctx                   context.Context
		want                  int64
		wantErr               string
	}{
		{"txt, one sample a line", "a.jpg 1\nb.jpg 0\nc.jpg 1\n", "txt", DefaultMaxIndexBytes, nil, 3, ""},
		{"txt, last line without newline", "a.jpg 1\nb.jpg 0", "txt", DefaultMaxIndexBytes, nil, 2, ""},
		{"txt, empty lines count as LC's scanner counts them", "a\n\nb\n", "txt", DefaultMaxIndexBytes, nil, 3, ""},
		{"txt, empty", "", "txt", DefaultMaxIndexBytes, nil, 0, ""},
		{"csv, the header is no sample", "path,label\na.jpg,1\nb.jpg,0\n", "csv", DefaultMaxIndexBytes, nil, 2, ""},
		{"csv, empty: no header", "", "csv", DefaultMaxIndexBytes, nil, 0, "no header"},
		{"another format", "a\n", "json", DefaultMaxIndexBytes, nil, 0, `format "json"`},
		{"exactly the byte bound", "a\nb\n", "txt", 4, nil, 2, ""},
		{"past the byte bound: no partial count", "a\nb\nc\n", "txt", 4, nil, 0, "over the byte bound"},
		{"past the time bound: no partial count", "a\nb\n", "txt", DefaultMaxIndexBytes, ended, 0, "context canceled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := c.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			got, err := countSamples(ctx, strings.NewReader(c.content), c.format, c.maxBytes)
			if got != c.want || (err == nil) != (c.wantErr == "") || (err != nil && !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("countSamples = %d, %v; want %d (error: %q)", got, err, c.want, c.wantErr)
			}
		})
	}
}

type seq struct{ n uint64 }

func (s *seq) NextCounter(string) (uint64, error) { s.n++; return s.n, nil }

// trainer is a trainer of dataset in namespace ns whose pod mounts the node directories mounts (none given: the
// index's directory, as the controller renders a trainer).
func trainer(dataset, index string, mounts ...string) desired.Worker {
	if len(mounts) == 0 {
		mounts = []string{path.Dir(index)}
	}
	var volumes []map[string]any
	for _, m := range mounts {
		volumes = append(volumes, map[string]any{"name": "v", "hostPath": map[string]any{"path": m, "type": "Directory"}})
	}
	manifest, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod", "spec": map[string]any{"volumes": volumes}})
	return desired.Worker{Namespace: "ns", Name: dataset + "-trainworker-0", Dataset: dataset, DatasetIndex: index, DatasetFormat: "txt",
		Manifest: string(manifest)}
}

// published records the counts a DatasetCounter publishes, by Dataset.
type published struct {
	mu     sync.Mutex
	counts map[string][]int64
}

func (p *published) sink(t *testing.T) Sink {
	return sinkFunc(func(e journal.Entry) error {
		if e.Topic != "lifeline/v1/c/nodes/edge-1/datasets" || e.QoS != 1 {
			t.Errorf("entry on %s QoS %d", e.Topic, e.QoS)
		}
		m := &lifelinev1.DatasetSamples{}
		if err := proto.Unmarshal(e.Payload, m); err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.counts == nil {
			p.counts = map[string][]int64{}
		}
		p.counts[m.Dataset] = append(p.counts[m.Dataset], m.NumberOfSamples)
		return nil
	})
}

func (p *published) get() map[string][]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]int64{}
	for k, v := range p.counts {
		out[k] = append([]int64(nil), v...)
	}
	return out
}

// logLines is a logger at V(2) that keeps what it logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{Verbosity: 2})
}

func (l *logLines) matching(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// countOnce runs c.CountOnce, failing the test should it not return: a blocked open would stop the node's
// counting for good.
func countOnce(t *testing.T, c *DatasetCounter) {
	t.Helper()
	done := make(chan struct{})
	go func() { c.CountOnce(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a bound for a blocked counter, not a measure
		t.Fatalf("counting did not return")
	}
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

// [P-DS-1] The counter publishes a trainer's Dataset count once, again when the index changes, and never for
// workers without Dataset marks.
func TestDatasetCounterPublishesOnChange(t *testing.T) {
	root := t.TempDir()
	index := filepath.Join(root, "data", "set0", "train.txt")
	writeFile(t, index, "a\nb\n")
	var sent []*lifelinev1.DatasetSamples
	c := &DatasetCounter{Cluster: "c", Node: "edge-1", HostRoot: root, BirthSeq: func() uint64 { return 3 }, Counter: &seq{}, Log: logr.Discard(),
		Sink: sinkFunc(func(e journal.Entry) error {
			m := &lifelinev1.DatasetSamples{}
			if err := proto.Unmarshal(e.Payload, m); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, m)
			return nil
		}),
		Workers: func() []desired.Worker {
			again := trainer("d0", "/data/set0/train.txt")
			again.Name = "d0-trainworker-1"
			return []desired.Worker{trainer("d0", "/data/set0/train.txt"), again, {Namespace: "ns", Name: "ji-edge"}}
		}}
	c.CountOnce()
	c.CountOnce()
	writeFile(t, index, "a\nb\nc\n")
	c.CountOnce()
	if len(sent) != 2 || sent[0].NumberOfSamples != 2 || sent[1].NumberOfSamples != 3 ||
		sent[0].Dataset != "d0" || sent[0].Namespace != "ns" || sent[1].Seq != 2 || sent[1].BirthSeq != 3 {
		t.Errorf("published %v, want 2 samples, then 3", sent)
	}
}

// The index path is a pod's annotation, and the agent reads as root: whatever a pod names, the agent reads
// nothing its pod could not read itself, follows no symlink, opens nothing but regular files, reads within a
// bound, and each refusal is logged once while the node's other Datasets are still counted.
func TestIndexesTheAgentMustNotRead(t *testing.T) {
	const stateDir = "/var/lib/lifeline-agent"
	for _, c := range []struct {
		name    string
		setUp   func(t *testing.T, root, outside string) desired.Worker
		wantLog string
	}{
		{"a FIFO, whose open would block the counting for ever", func(t *testing.T, root, _ string) desired.Worker {
			if err := os.MkdirAll(filepath.Join(root, "data", "bad"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(filepath.Join(root, "data", "bad", "train.txt"), 0o644); err != nil {
				t.Fatal(err)
			}
			return trainer("bad", "/data/bad/train.txt")
		}, "index /data/bad/train.txt is no regular file"},
		{"a directory", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, "data", "bad", "x", "train.txt"), "a\n")
			return trainer("bad", "/data/bad/x")
		}, "index /data/bad/x is no regular file"},
		{"a symlink to /dev/zero, which never ends", func(t *testing.T, root, _ string) desired.Worker {
			symlink(t, "/dev/zero", filepath.Join(root, "data", "bad", "train.txt"))
			return trainer("bad", "/data/bad/train.txt")
		}, "index /data/bad/train.txt is a symlink"},
		{"a file symlinked out of the host root", func(t *testing.T, root, outside string) desired.Worker {
			writeFile(t, filepath.Join(outside, "secret"), "s\ne\nc\n")
			symlink(t, filepath.Join(outside, "secret"), filepath.Join(root, "data", "bad", "train.txt"))
			return trainer("bad", "/data/bad/train.txt")
		}, "index /data/bad/train.txt is a symlink"},
		{"a directory symlinked out of the host root", func(t *testing.T, root, outside string) desired.Worker {
			writeFile(t, filepath.Join(outside, "train.txt"), "s\ne\nc\n")
			symlink(t, outside, filepath.Join(root, "data", "bad"))
			return trainer("bad", "/data/bad/train.txt")
		}, "index /data/bad/train.txt: /data/bad is a symlink"},
		{"a symlink within the host root to a file the pod does not mount", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, "home", "admin", "notes"), "s\ne\nc\n")
			symlink(t, "../../home/admin/notes", filepath.Join(root, "data", "bad", "train.txt"))
			return trainer("bad", "/data/bad/train.txt")
		}, "index /data/bad/train.txt is a symlink"},
		{"a file the worker's pod does not mount", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, "home", "admin", "notes"), "s\ne\nc\n")
			writeFile(t, filepath.Join(root, "data", "bad", "train.txt"), "a\n")
			return trainer("bad", "/home/admin/notes", "/data/bad")
		}, "index /home/admin/notes: pod ns/bad-trainworker-0 mounts no node directory holding it"},
		{"a pod that names its index but mounts nothing", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, "home", "admin", "notes"), "s\ne\nc\n")
			w := trainer("bad", "/home/admin/notes")
			w.Manifest = ""
			return w
		}, "index /home/admin/notes: pod ns/bad-trainworker-0 mounts no node directory holding it"},
		{"a file under /etc, though the pod mounts it", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, "etc", "shadow"), "root:x\n")
			return trainer("bad", "/etc/shadow")
		}, "index /etc/shadow is under /etc, which the agent never reads"},
		{"the agent's own state, though the pod mounts the node's root", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, stateDir, "journal.db"), "x\n")
			return trainer("bad", stateDir+"/journal.db", "/")
		}, "index /var/lib/lifeline-agent/journal.db is under /var/lib/lifeline-agent, which the agent never reads"},
		{"a file over the byte bound", func(t *testing.T, root, _ string) desired.Worker {
			writeFile(t, filepath.Join(root, "data", "bad", "train.txt"), strings.Repeat("a.jpg 1\n", 100))
			return trainer("bad", "/data/bad/train.txt")
		}, "index /data/bad/train.txt: index file over the byte bound of 64 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, outside := t.TempDir(), t.TempDir()
			bad := c.setUp(t, root, outside)
			writeFile(t, filepath.Join(root, "data", "good", "train.txt"), "a\nb\n")
			var got published
			var logs logLines
			counter := &DatasetCounter{Cluster: "c", Node: "edge-1", HostRoot: root, StateDir: stateDir, MaxIndexBytes: 64,
				BirthSeq: func() uint64 { return 1 }, Counter: &seq{}, Log: logs.logger(), Sink: got.sink(t),
				Workers: func() []desired.Worker { return []desired.Worker{bad, trainer("good", "/data/good/train.txt")} }}
			countOnce(t, counter)
			countOnce(t, counter)
			if counts := got.get(); len(counts) != 1 || len(counts["good"]) != 1 || counts["good"][0] != 2 {
				t.Errorf("published %v, want the good Dataset's 2 samples only", counts)
			}
			if n := logs.matching(c.wantLog); n != 1 {
				t.Errorf("%q logged %d times in two counts, want once; log:\n%s", c.wantLog, n, strings.Join(logs.lines, "\n"))
			}
		})
	}
}

// A read that stalls (an index on a hung network mount) past the time bound is not counted, does not delay the
// other Datasets beyond the bound, is not started again while it hangs, and is counted once it has ended.
func TestAStalledIndexReadDoesNotStopOtherDatasets(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "data", "stalled", "train.txt"), "a\nb\nc\n")
	writeFile(t, filepath.Join(root, "data", "good", "train.txt"), "a\nb\n")
	hung := make(chan struct{})
	var mu sync.Mutex
	reads := map[string]int{}
	var got published
	var logs logLines
	c := &DatasetCounter{Cluster: "c", Node: "edge-1", HostRoot: root, CountTimeout: 50 * time.Millisecond,
		BirthSeq: func() uint64 { return 1 }, Counter: &seq{}, Log: logs.logger(), Sink: got.sink(t),
		Workers: func() []desired.Worker {
			return []desired.Worker{trainer("stalled", "/data/stalled/train.txt"), trainer("good", "/data/good/train.txt")}
		},
		countFile: func(ctx context.Context, hostRoot, index, format string, maxBytes int64) (int64, error) {
			mu.Lock()
			reads[index]++
			mu.Unlock()
			if strings.Contains(index, "stalled") {
				<-hung // as a read of a hung mount: deaf to ctx
			}
			return countIndex(ctx, hostRoot, index, format, maxBytes)
		}}
	countOnce(t, c)
	countOnce(t, c)
	if counts := got.get(); len(counts) != 1 || len(counts["good"]) != 1 || counts["good"][0] != 2 {
		t.Errorf("published %v while a read hangs, want the good Dataset's 2 samples only", counts)
	}
	mu.Lock()
	if reads["/data/stalled/train.txt"] != 1 {
		t.Errorf("the hanging index was read %d times, want once", reads["/data/stalled/train.txt"])
	}
	mu.Unlock()
	for _, want := range []string{"index /data/stalled/train.txt: not read within 50ms", "index /data/stalled/train.txt: still reading it"} {
		if logs.matching(want) != 1 {
			t.Errorf("%q not logged once; log:\n%s", want, strings.Join(logs.lines, "\n"))
		}
	}

	close(hung)
	for i := 0; i < 500 && len(got.get()["stalled"]) == 0; i++ { // up to 5 s for the hung read to end
		countOnce(t, c)
		waitABit()
	}
	if counts := got.get(); len(counts["stalled"]) != 1 || counts["stalled"][0] != 3 {
		t.Errorf("published %v once the read ended, want the stalled Dataset's 3 samples", counts)
	}
}

// An index that is missing, or a path through a file, is not counted, and the error says why.
func TestMissingIndexIsNotCounted(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "data", "file"), "a\n")
	for _, c := range []struct{ name, index, wantErr string }{
		{"missing file", "/data/missing.txt", "no such file"},
		{"missing directory", "/nowhere/train.txt", "no such file"},
		{"a file as a directory", "/data/file/train.txt", "not a directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, err := countIndex(context.Background(), root, c.index, "txt", DefaultMaxIndexBytes)
			if n != 0 || err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("countIndex = %d, %v; want an error with %q", n, err, c.wantErr)
			}
		})
	}
}
