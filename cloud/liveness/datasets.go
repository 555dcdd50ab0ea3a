package liveness

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// DatasetKind is the kind of the workload refs the tracker announces when a Dataset's count changed.
const DatasetKind = "Dataset"

// maxDatasetsPerNode bounds the Datasets a node's counts are kept for.
const maxDatasetsPerNode = 64

// DatasetNodes is the tracker's window on the API server's Datasets (the manager's cache).
type DatasetNodes interface {
	// DatasetNode returns the spec.nodeName of Dataset namespace/name; false when the cache has no such Dataset.
	DatasetNode(namespace, name string) (string, bool)
}

// CacheDatasets reads Datasets from a cache.
type CacheDatasets struct {
	Reader client.Reader
}

// DatasetNode implements DatasetNodes.
func (c CacheDatasets) DatasetNode(namespace, name string) (string, bool) {
	ds := &v1alpha1.Dataset{}
	if err := c.Reader.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, ds); err != nil {
		return "", false
	}
	return ds.Spec.NodeName, true
}

// DatasetCount is the latest number of samples a node counted in a Dataset.
type DatasetCount struct {
	Samples int64
	At      time.Time // when the controller accepted it
	node    string
}

// datasetStanding judges a node's count by the Dataset it names: the Dataset's spec.nodeName must be the node
// [P-DS-2].
func (t *Tracker) datasetStanding(node string, m *lifelinev1.DatasetSamples) string {
	if lifelinev1.CheckDNSLabel(m.Namespace) != nil || lifelinev1.CheckDNSSubdomain(m.Dataset) != nil || m.NumberOfSamples < 0 {
		return DropDecode
	}
	if t.Datasets == nil {
		return DropUnknownDataset
	}
	switch owner, known := t.Datasets.DatasetNode(m.Namespace, m.Dataset); {
	case !known:
		return DropUnknownDataset
	case owner != node:
		return DropForged
	}
	return ""
}

// applyDataset keeps a count whose Dataset check found true, with t.mu held.
func (t *Tracker) applyDataset(node string, m *lifelinev1.DatasetSamples, now time.Time, changed *changes) string {
	n := t.nodes[node]
	switch {
	case n == nil || !n.born:
		return DropUnknown
	case m.Seq <= n.datasetSeq:
		return DropReplayed
	}
	key := podRef{m.Namespace, m.Dataset}
	old, had := t.datasets[key]
	if !had && n.datasets >= maxDatasetsPerNode {
		return DropOverflow
	}
	n.datasetSeq = m.Seq
	if had && old.node != node {
		t.nodes[old.node].datasets--
		had = false
	}
	if !had {
		n.datasets++
	}
	t.datasets[key] = DatasetCount{Samples: m.NumberOfSamples, At: now, node: node}
	changed.workloads = []workloadRef{{DatasetKind, m.Namespace, m.Dataset}}
	return ""
}

// DatasetSamples returns the latest count of Dataset namespace/name; false when no node counted it lately.
func (t *Tracker) DatasetSamples(namespace, name string) (DatasetCount, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.datasets[podRef{namespace, name}]
	return c, ok
}

// pruneDatasets forgets counts older than forgetAfter, with t.mu held: they were written long ago.
func (t *Tracker) pruneDatasets(now time.Time) {
	for ref, c := range t.datasets {
		if now.Sub(c.At) > forgetAfter {
			t.nodes[c.node].datasets--
			delete(t.datasets, ref)
		}
	}
}
