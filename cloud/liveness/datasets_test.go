package liveness

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// fakeDatasets is the API server's Datasets: namespace/name -> spec.nodeName.
type fakeDatasets map[string]string

func (f fakeDatasets) DatasetNode(namespace, name string) (string, bool) {
	node, ok := f[namespace+"/"+name]
	return node, ok
}

// [P-DS-2] A node's count is kept only of a Dataset whose spec.nodeName is the node, in seq order, and for at
// most maxDatasetsPerNode Datasets of a node.
func TestDatasetCountsAreCheckedAndBounded(t *testing.T) {
	b := newBench(t)
	sets := fakeDatasets{"ns/d0": "edge1", "ns/d1": "edge2"}
	b.tr.Datasets = sets
	now := time.Unix(1000, 0)
	b.cutOff("edge1", now)
	count := func(seq uint64, dataset string, n int64) {
		payload, _ := proto.Marshal(&lifelinev1.DatasetSamples{Namespace: "ns", Dataset: dataset, NumberOfSamples: n, Seq: seq, BirthSeq: 1})
		b.tr.Ingest(lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindDataset).String(), payload, now)
	}
	count(1, "d0", 120)
	count(2, "d1", 7)       // edge2's Dataset
	count(3, "nobody", 7)   // no such Dataset
	count(4, "d0", -1)      // not a count
	count(1, "d0", 99)      // replayed
	count(5, "Bad_Name", 1) // not a name
	if c, ok := b.tr.DatasetSamples("ns", "d0"); !ok || c.Samples != 120 {
		t.Errorf("count of d0 %+v %v, want 120", c, ok)
	}
	if _, ok := b.tr.DatasetSamples("ns", "d1"); ok {
		t.Errorf("another node's Dataset counted")
	}
	if b.dropped(DropForged) != 1 || b.dropped(DropUnknownDataset) != 1 || b.dropped(DropDecode) != 2 || b.dropped(DropReplayed) != 1 {
		t.Errorf("dropped forged %v, unknown %v, decode %v, replayed %v; want 1, 1, 2, 1", b.dropped(DropForged),
			b.dropped(DropUnknownDataset), b.dropped(DropDecode), b.dropped(DropReplayed))
	}
	for i := range maxDatasetsPerNode + 10 {
		sets[fmt.Sprintf("ns/flood-%d", i)] = "edge1"
		count(uint64(10+i), fmt.Sprintf("flood-%d", i), 1)
	}
	if n := b.tr.nodes["edge1"].datasets; n != maxDatasetsPerNode {
		t.Errorf("%d Datasets kept of one node, want %d", n, maxDatasetsPerNode)
	}
	b.tr.prune(now.Add(2 * forgetAfter))
	if n := b.tr.nodes["edge1"].datasets; n != 0 || len(b.tr.datasets) != 0 {
		t.Errorf("%d counts kept two hours on", n)
	}
}
