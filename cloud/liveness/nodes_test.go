package liveness

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// fakeNodes is the API server's Nodes: name -> whether it is an edge Node; a name absent has no Node. Names in
// failing make the lookup fail.
type fakeNodes struct {
	edge    map[string]bool
	failing map[string]bool
}

func (f fakeNodes) IsEdgeNode(_ context.Context, name string) (bool, error) {
	if f.failing[name] {
		return false, errors.New("cache not synced")
	}
	return f.edge[name], nil
}

// A node that goes leaves nothing behind, so the names of nodes come and gone over the controller's life never
// fill the table: with the table full of nodes that were deleted and forgotten, a new node comes online, and
// what the deleted nodes' agents said no longer counts — their workers go back to the API server's word.
func TestDeletedNodesAreForgottenSoNewNodesComeOnline(t *testing.T) {
	b := newBench(t)
	b.tr.nodeCap = 100
	nodes := fakeNodes{edge: map[string]bool{}}
	b.tr.Nodes = nodes
	b.tr.Datasets = fakeDatasets{"ns/d0": "old0"}
	now := time.Unix(1000, 0)
	for i := range b.tr.nodeCap {
		name := fmt.Sprintf("old%d", i)
		nodes.edge[name] = true
		b.cutOff(name, now)
	}
	pod := b.addPod("old0", "default", "w0", "u0")
	b.pods[podRef{"default", "w0"}] = PodInfo{Node: "old0", UID: "u0", Worker: "w0", OwnerKind: "FederatedLearningJob", OwnerName: "job"}
	b.state("old0", &lifelinev1.WorkerState{Namespace: "default", Name: "w0", Uid: "u0", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	b.result("old0", &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: "w0", PodUid: "u0", Local: true}, now)
	b.report("old0", 1, "default", "w0", `{"name":"w0","namespace":"default","ownerName":"job","ownerKind":"federatedlearningjob"}`, now)
	payload := marshal(&lifelinev1.DatasetSamples{Namespace: "ns", Dataset: "d0", NumberOfSamples: 5, Seq: 1, BirthSeq: 1})
	b.tr.Ingest(lifelinev1.NodeTopic("c", "old0", lifelinev1.KindDataset).String(), payload, now)
	if _, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, now), true, now); err != nil || len(b.out.sent) != 1 {
		t.Fatalf("no command to the cut-off node (%v): the setup is wrong", err)
	}

	nodes.edge["new"] = true
	b.cutOff("new", now)
	if b.tr.SpeaksFor("new", now) {
		t.Fatal("a node beyond the cap was taken: the table was not full")
	}
	for i := range b.tr.nodeCap {
		name := fmt.Sprintf("old%d", i)
		delete(nodes.edge, name)
		b.tr.ForgetNode(name)
	}
	b.cutOff("new", now.Add(time.Second))
	if !b.tr.SpeaksFor("new", now.Add(time.Second)) {
		t.Errorf("a new node is not online after the deleted nodes were forgotten (%v dropped for overflow)", b.dropped(DropOverflow))
	}

	if v := b.tr.ViewOf(pod, true, now); v.Truth != TruthAPIServer {
		t.Errorf("a forgotten node's worker: truth %s, want the API server's", v.Truth)
	}
	if a := b.tr.TakeActions("default", "w0"); len(a) != 0 {
		t.Errorf("%d results of a forgotten node kept", len(a))
	}
	if r := b.tr.Reports("FederatedLearningJob", "default", "job"); len(r) != 0 {
		t.Errorf("%d reports of a forgotten node kept", len(r))
	}
	if _, ok := b.tr.DatasetSamples("ns", "d0"); ok {
		t.Error("a forgotten node's Dataset count kept")
	}
	b.tr.mu.Lock()
	nodesLeft, sent, pending := len(b.tr.nodes), len(b.tr.sent), len(b.tr.pending)
	b.tr.mu.Unlock()
	if nodesLeft != 1 || sent != 0 || pending != 0 {
		t.Errorf("after forgetting: %d nodes, %d commands, %d pending states; want 1, 0, 0", nodesLeft, sent, pending)
	}
	checkTable(t, b.tr, b.pods, now)
}

// Names that are not edge Nodes of the cluster — made up, of a cloud node, of a Node deleted while its agent's
// messages were on their way — get no record, so they cannot fill the table; a node the API server has comes
// online beside them.
func TestNamesThatAreNotEdgeNodesGetNoRecord(t *testing.T) {
	b := newBench(t)
	b.tr.nodeCap = 100
	nodes := fakeNodes{edge: map[string]bool{"edge1": true, "cloud1": false}, failing: map[string]bool{"unsure": true}}
	b.tr.Nodes = nodes
	now := time.Unix(1000, 0)
	for i := range 2 * b.tr.nodeCap {
		name := fmt.Sprintf("made-up-%d", i)
		b.addPod(name, "default", name, name)
		b.cutOff(name, now)
		b.state(name, &lifelinev1.WorkerState{Namespace: "default", Name: name, Uid: name, Seq: 1}, now)
		b.result(name, &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: name, PodUid: name, Local: true}, now)
	}
	b.cutOff("cloud1", now)
	b.cutOff("edge1", now)
	if !b.tr.SpeaksFor("edge1", now) {
		t.Error("an edge Node's agent is not heard")
	}
	b.tr.mu.Lock()
	held := len(b.tr.nodes)
	b.tr.mu.Unlock()
	if held != 1 {
		t.Errorf("%d nodes held, want only edge1", held)
	}
	if got, want := b.dropped(DropUnknownNode), float64(3*2*b.tr.nodeCap+1); got != want {
		t.Errorf("%v messages dropped as of no edge Node, want %v", got, want)
	}
	// A lookup that fails says neither yes nor no: the node is taken (a lost birth would leave it offline until
	// its agent reconnects), the cap still bounding the table.
	b.cutOff("unsure", now)
	if !b.tr.SpeaksFor("unsure", now) {
		t.Error("a node whose Node could not be looked up was refused")
	}
}

// A node whose Node went while the controller missed the event (a watch that lagged, a replica that was not the
// leader) is forgotten by the periodic prune once its agent is silent; an edge Node's silent record is kept, and
// so is the record of an agent still heard (nothing would make it announce itself again if its Node came back).
func TestNodesWhoseDeletionWasMissedArePruned(t *testing.T) {
	b := newBench(t)
	nodes := fakeNodes{edge: map[string]bool{"gone": true, "stays": true, "heard": true, "unsure": true}, failing: map[string]bool{}}
	b.tr.Nodes = nodes
	now := time.Unix(1000, 0)
	for _, name := range []string{"gone", "stays", "heard", "unsure"} {
		b.cutOff(name, now)
	}
	delete(nodes.edge, "gone")
	delete(nodes.edge, "heard")
	nodes.failing["unsure"] = true
	later := now.Add(time.Minute)
	b.heartbeat("heard", 1, 2, false, later)
	b.tr.prune(later)
	b.tr.mu.Lock()
	_, gone := b.tr.nodes["gone"]
	_, stays := b.tr.nodes["stays"]
	_, heard := b.tr.nodes["heard"]
	_, unsure := b.tr.nodes["unsure"]
	b.tr.mu.Unlock()
	if gone || !stays || !heard || !unsure {
		t.Errorf("after the prune: gone %v, stays %v, heard %v, unsure %v; want only gone forgotten", gone, stays, heard, unsure)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: types.UID("u")}, Spec: corev1.PodSpec{NodeName: "gone"}}
	if v := b.tr.ViewOf(pod, true, later); v.Truth != TruthAPIServer {
		t.Errorf("a pruned node's worker: truth %s", v.Truth)
	}
}
