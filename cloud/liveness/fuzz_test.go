package liveness

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// fuzzPods is the API server the fuzz targets run against: pods on two nodes, one in a namespace named
// "report", one node's pod a worker of a JI service.
func fuzzPods() fakePods {
	return fakePods{
		{"default", "p0"}: {Node: "n0", UID: "u0", Worker: "p0", OwnerKind: "FederatedLearningJob", OwnerName: "job"},
		{"default", "p1"}: {Node: "n0", UID: "u1", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"},
		{"default", "p2"}: {Node: "n1", UID: "u0", Worker: "p2", OwnerKind: "FederatedLearningJob", OwnerName: "job"},
		{"report", "x"}:   {Node: "n0", UID: "u1", Worker: "x", OwnerKind: "FederatedLearningJob", OwnerName: "report"},
	}
}

var fuzzRefs = []podRef{{"default", "p0"}, {"default", "p1"}, {"default", "p2"}, {"report", "x"}, {"default", "p3"}}

func newFuzzTracker(t *testing.T) (*Tracker, fakePods) {
	tr, err := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	pods := fuzzPods()
	tr.Pods = pods
	return tr, pods
}

// checkTable holds the table to its bounds and its bookkeeping to what it counts, and runs every reader on it.
func checkTable(t *testing.T, tr *Tracker, pods fakePods, now time.Time) {
	t.Helper()
	tr.mu.Lock()
	results, reports := map[string]int{}, map[string]int{}
	for _, rs := range tr.actions {
		for _, r := range rs {
			results[r.node]++
		}
	}
	for _, workers := range tr.reports {
		for _, r := range workers {
			reports[r.node]++
		}
	}
	pendingTotal := 0
	if len(tr.nodes) > maxNodes {
		t.Errorf("%d nodes", len(tr.nodes))
	}
	for name, n := range tr.nodes {
		pending := 0
		for ref, w := range n.workers {
			if w.pending {
				pending++
				if !tr.pending[workerKey{name, ref}] {
					t.Errorf("%s %v pending but not listed", name, ref)
				}
			}
		}
		pendingTotal += pending
		switch {
		case len(n.workers) > maxWorkersPerNode, pending != n.pending, n.pending > maxPendingPerNode:
			t.Errorf("node %s: %d workers, %d pending (counted %d)", name, len(n.workers), pending, n.pending)
		case results[name] != n.results, n.results > maxResultsPerNode:
			t.Errorf("node %s: %d results (counted %d)", name, results[name], n.results)
		case reports[name] != n.reports, n.reports > maxReportsPerNode:
			t.Errorf("node %s: %d reports (counted %d)", name, reports[name], n.reports)
		}
	}
	if pendingTotal != len(tr.pending) {
		t.Errorf("%d pending records, %d listed", pendingTotal, len(tr.pending))
	}
	workloads := make([]workloadRef, 0, len(tr.reports))
	for w := range tr.reports {
		workloads = append(workloads, w)
	}
	tr.mu.Unlock()
	for _, w := range workloads {
		for _, r := range tr.Reports(w.kind, w.namespace, w.name) {
			if len(r.OwnerInfo) > MaxMetrics || len(r.Results) > maxResults {
				t.Errorf("a report kept with %d metrics and %d results", len(r.OwnerInfo), len(r.Results))
			}
			for _, res := range r.Results {
				if len(res.Metrics) > MaxMetrics {
					t.Errorf("a result kept with %d metrics", len(res.Metrics))
				}
			}
		}
	}
	out := &recordedCommands{}
	for ref, info := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.namespace, Name: ref.name, UID: types.UID(info.UID)},
			Spec: corev1.PodSpec{NodeName: info.Node}}
		if _, err := tr.HealDead(out, pod, tr.ViewOf(pod, false, now), true, now); err != nil {
			t.Error(err)
		}
	}
	for i, c := range out.sent {
		if info := pods[podRef{c.Namespace, c.Pod}]; info.Node != out.to[i] || info.UID != c.PodUid {
			t.Errorf("command %s for %s/%s sent to %s", c.Id, c.Namespace, c.Pod, out.to[i])
		}
	}
}

// Any topic and payload, alone, on a table that knows a node: nothing panics and the table keeps its bounds
// [P-BAD-1].
func FuzzIngest(f *testing.F) {
	for _, seed := range []struct {
		topic string
		msg   []byte
	}{
		{"lifeline/v1/c/nodes/n0/birth", marshal(&lifelinev1.NodeBirth{Node: "n0", BirthSeq: 2, StateId: "s"})},
		{"lifeline/v1/c/nodes/n0/death", marshal(&lifelinev1.NodeDeath{Node: "n0", BirthSeq: 1})},
		{"lifeline/v1/c/nodes/n0/heartbeat", marshal(&lifelinev1.Heartbeat{BirthSeq: 1, Seq: 9})},
		{"lifeline/v1/c/nodes/n0/workers/report/x", marshal(&lifelinev1.WorkerState{Namespace: "report", Name: "x", Uid: "u1", Seq: 4, Episode: 4, Phase: lifelinev1.Phase_PHASE_FAILED})},
		{"lifeline/v1/c/nodes/n0/results", marshal(&lifelinev1.CommandResult{CommandId: "local/report/x/u/1", Namespace: "report", Pod: "x", PodUid: "u1", Local: true})},
		{"lifeline/v1/c/nodes/n0/reports", marshal(&lifelinev1.WorkerReport{Namespace: "default", Worker: "p0", Seq: 3,
			Body: []byte(`{"name":"p0","namespace":"default","ownerName":"job","ownerKind":"default","ownerInfo":{"currentRound":1},"results":[{"format":"pb","url":"/m","metrics":{"loss":0.5}}]}`)})},
		{"lifeline/v1/c/nodes/n0/commands", nil},
		{"lifeline/v1/c/nodes/report/workers/report/report", []byte{0xff}},
	} {
		f.Add(seed.topic, seed.msg)
	}
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		tr, pods := newFuzzTracker(t)
		now := time.Unix(1000, 0)
		tr.Ingest("lifeline/v1/c/nodes/n0/birth", marshal(&lifelinev1.NodeBirth{Node: "n0", BirthSeq: 1, StateId: "s"}), now)
		tr.Ingest(topic, payload, now)
		tr.tick(now.Add(time.Minute))
		checkTable(t, tr, pods, now.Add(time.Minute))
		tr.prune(now.Add(2 * time.Hour))
		checkTable(t, tr, pods, now.Add(2*time.Hour))
	})
}

// A sequence of well-formed messages of every kind, of three nodes on a few pods (some of other nodes, one the
// API server does not have), with time passing, nodes forgotten, and the controller reading and acting between
// them: nothing panics, the table keeps its bounds and its counts, and no command goes to a node for another
// node's pod. Each op is 6 bytes: kind, node, pod, seq, and two bytes that shape the message.
func FuzzIngestSequence(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 0, 2, 0, 0, 1, 0, 0, 3, 0, 0, 5, 4, 5, 4, 0, 0, 6, 1, 5, 7, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 9, 0, 0, 3, 1, 2, 3, 4, 3, 4, 1, 2, 1, 1, 0, 5, 1, 2, 2, 2, 7, 0, 0, 4, 3, 5, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 6*256 {
			return
		}
		tr, pods := newFuzzTracker(t)
		now := time.Unix(1000, 0)
		for i := 0; i+6 <= len(ops); i += 6 {
			kind, node, ref, seq, a, b := ops[i]%10, fmt.Sprintf("n%d", ops[i+1]%3), fuzzRefs[int(ops[i+2])%len(fuzzRefs)], uint64(ops[i+3]), ops[i+4], ops[i+5]
			nodeTopic := func(k lifelinev1.Kind) string { return lifelinev1.NodeTopic("c", node, k).String() }
			switch kind {
			case 0:
				tr.Ingest(nodeTopic(lifelinev1.KindBirth), marshal(&lifelinev1.NodeBirth{Node: node, BirthSeq: seq,
					StateId: fmt.Sprint("s", a%2), BootId: fmt.Sprint("b", b%2)}), now)
			case 1:
				tr.Ingest(nodeTopic(lifelinev1.KindDeath), marshal(&lifelinev1.NodeDeath{Node: node, BirthSeq: seq}), now)
			case 2:
				tr.Ingest(nodeTopic(lifelinev1.KindHeartbeat), marshal(&lifelinev1.Heartbeat{BirthSeq: uint64(a % 8), Seq: seq, ApiReachable: b%2 == 0}), now)
			case 3:
				tr.Ingest(lifelinev1.WorkerTopic("c", node, ref.namespace, ref.name).String(), marshal(&lifelinev1.WorkerState{
					Namespace: ref.namespace, Name: ref.name, Uid: fmt.Sprint("u", a%2), Seq: seq, Episode: uint64(b),
					Phase: lifelinev1.Phase(a % 6)}), now)
			case 4:
				tr.Ingest(nodeTopic(lifelinev1.KindResult), marshal(&lifelinev1.CommandResult{CommandId: fmt.Sprintf("rebuild/u%d/%d", a%2, b),
					Namespace: ref.namespace, Pod: ref.name, PodUid: fmt.Sprint("u", a%2), Local: b%2 == 0}), now)
			case 5:
				info := pods[ref]
				body := fmt.Sprintf(`{"name":%q,"namespace":%q,"ownerName":%q,"ownerKind":%q,"ownerInfo":{"n%d":%d,"t":"%s","currentRound":%d},"results":[{"metrics":{"m%d":1}}]}`,
					info.Worker, ref.namespace, []string{"job", "svc", "report"}[a%3], []string{"default", "jointinferenceservice"}[b%2], a, b, string(rune(a)), b, a)
				tr.Ingest(nodeTopic(lifelinev1.KindReport), marshal(&lifelinev1.WorkerReport{Namespace: ref.namespace, Worker: info.Worker, Seq: seq, Body: []byte(body)}), now)
			case 6:
				tr.TakeActions(ref.namespace, ref.name)
			case 7:
				now = now.Add(time.Duration(a) * time.Second)
				tr.tick(now)
			case 8:
				now = now.Add(time.Duration(a) * time.Minute)
				tr.prune(now)
			case 9:
				tr.ForgetNode(node)
			}
			checkTable(t, tr, pods, now)
		}
	})
}
