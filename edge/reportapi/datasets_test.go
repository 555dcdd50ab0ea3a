package reportapi

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

func TestCountSamplesAsSednasLC(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, content, format string
		want                  int64
		wantErr               bool
	}{
		{"txt, one sample a line", "a.jpg 1\nb.jpg 0\nc.jpg 1\n", "txt", 3, false},
		{"txt, last line without newline", "a.jpg 1\nb.jpg 0", "txt", 2, false},
		{"txt, empty lines count as LC's scanner counts them", "a\n\nb\n", "txt", 3, false},
		{"txt, empty", "", "txt", 0, false},
		{"csv, the header is no sample", "path,label\na.jpg,1\nb.jpg,0\n", "csv", 2, false},
		{"csv, empty: no header", "", "csv", 0, true},
		{"another format", "a\n", "json", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name)
			if err := os.WriteFile(p, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := CountSamples(p, c.format)
			if (err != nil) != c.wantErr || got != c.want {
				t.Errorf("CountSamples = %d, %v; want %d (error: %v)", got, err, c.want, c.wantErr)
			}
		})
	}
	if _, err := CountSamples(filepath.Join(dir, "missing"), "txt"); err == nil {
		t.Errorf("a missing index was counted")
	}
}

type seq struct{ n uint64 }

func (s *seq) NextCounter(string) (uint64, error) { s.n++; return s.n, nil }

// [P-DS-1] The counter publishes a trainer's Dataset count once, again when the index changes, and never for
// workers without Dataset marks.
func TestDatasetCounterPublishesOnChange(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "data", "set0"), 0o755); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(root, "data", "set0", "train.txt")
	if err := os.WriteFile(index, []byte("a\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sent []*lifelinev1.DatasetSamples
	c := &DatasetCounter{Cluster: "c", Node: "edge-1", HostRoot: root, BirthSeq: func() uint64 { return 3 }, Counter: &seq{}, Log: logr.Discard(),
		Sink: sinkFunc(func(e journal.Entry) error {
			if e.Topic != "lifeline/v1/c/nodes/edge-1/datasets" || e.QoS != 1 {
				t.Errorf("entry on %s QoS %d", e.Topic, e.QoS)
			}
			m := &lifelinev1.DatasetSamples{}
			if err := proto.Unmarshal(e.Payload, m); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, m)
			return nil
		}),
		Workers: func() []desired.Worker {
			return []desired.Worker{
				{Namespace: "ns", Name: "job-trainworker-0", Dataset: "d0", DatasetIndex: "/data/set0/train.txt", DatasetFormat: "txt"},
				{Namespace: "ns", Name: "job-trainworker-0-again", Dataset: "d0", DatasetIndex: "/data/set0/train.txt", DatasetFormat: "txt"},
				{Namespace: "ns", Name: "ji-edge"},
			}
		}}
	c.CountOnce()
	c.CountOnce()
	if err := os.WriteFile(index, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.CountOnce()
	if len(sent) != 2 || sent[0].NumberOfSamples != 2 || sent[1].NumberOfSamples != 3 ||
		sent[0].Dataset != "d0" || sent[0].Namespace != "ns" || sent[1].Seq != 2 || sent[1].BirthSeq != 3 {
		t.Errorf("published %v, want 2 samples, then 3", sent)
	}
}
