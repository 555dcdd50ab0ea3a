package liveness

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// A worker in a namespace named "report", or a result whose id looks like a local restart's path, once split
// the delivery goroutine's string keys out of range and crashed the controller (a crash loop, the states being
// retained). Keys are typed now: the subscriber gets the pod, the workload, and lives on.
func TestNamespaceNamedReportDoesNotCrash(t *testing.T) {
	b := newBench(t)
	ch := b.tr.Subscribe()
	now := time.Unix(1000, 0)
	b.addPod("edge1", "report", "x", "u")
	b.pods[podRef{"report", "t0"}] = PodInfo{Node: "edge1", UID: "t0", Worker: "t0", OwnerKind: "FederatedLearningJob", OwnerName: "report"}
	b.cutOff("edge1", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "report", Name: "x", Uid: "u", Seq: 1}, now)
	b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/report/x/u/1", Namespace: "report", Pod: "x", PodUid: "u", Local: true}, now)
	b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/report", Namespace: "report", Pod: "x", PodUid: "u"}, now)
	b.report("edge1", 1, "report", "t0", `{"name":"t0","namespace":"report","ownerName":"report","ownerKind":"federatedlearningjob"}`, now)

	got := map[string]bool{}
	deadline := time.After(5 * time.Second)
	for !got["Pod report/x"] || !got["FederatedLearningJob report/report"] {
		select {
		case ev := <-ch:
			kind := ev.Object.GetObjectKind().GroupVersionKind().Kind
			if _, isPod := ev.Object.(*corev1.Pod); isPod {
				kind = "Pod"
			}
			got[kind+" "+client.ObjectKeyFromObject(ev.Object).String()] = true
		case <-deadline:
			t.Fatalf("delivered %v, want the pod report/x and the job report/report", got)
		}
	}
	if n := len(b.tr.TakeActions("report", "x")); n != 1 {
		t.Errorf("%d results of report/x taken, want the local one", n)
	}
	if b.dropped(DropForged) != 1 {
		t.Errorf("%v forged, want 1 (the result that is neither local nor an answer)", b.dropped(DropForged))
	}
}

// Whatever goes wrong in building a change for a reader is recovered, counted and logged; the changes after it
// are delivered.
func TestDeliveryPanicIsRecoveredAndCounted(t *testing.T) {
	b := newBench(t)
	ch := b.tr.Subscribe()
	sub := b.tr.subscribers[0]
	sub.send(func() client.Object { panic("a bug in delivery") })
	if got := testutil.ToFloat64(b.tr.panics); got != 1 {
		t.Errorf("%v panics counted, want 1", got)
	}
	b.addPod("edge1", "default", "w", "u")
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1}, time.Unix(1000, 0))
	select {
	case ev := <-ch:
		if ev.Object.GetName() != "w" {
			t.Errorf("delivered %s, want w", ev.Object.GetName())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing delivered after a recovered panic")
	}
}

// [P-AUTH-3] A node's results are taken only for pods bound to it, with their UID, and, but for a local
// restart, only in answer to a command sent to that node for that pod.
func TestForgedResultForAnotherNodesPodDropped(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	pod := b.addPod("edge1", "default", "w", "u1")
	b.cutOff("edge1", now)
	b.cutOff("edge2", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 3, Episode: 3, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	id, err := b.tr.HealDead(b.out, pod, b.tr.ViewOf(pod, false, now), true, now)
	if err != nil || id == "" {
		t.Fatalf("no command sent: %v", err)
	}
	answer := func(id string, local bool, uid string) *lifelinev1.CommandResult {
		return &lifelinev1.CommandResult{CommandId: id, Outcome: lifelinev1.Outcome_OUTCOME_DONE, Namespace: "default", Pod: "w", PodUid: uid, Local: local}
	}
	forged := []struct {
		name, node string
		result     *lifelinev1.CommandResult
		reason     string
	}{
		{"another node answers the command", "edge2", answer(id, false, "u1"), DropForged},
		{"another node claims a local restart", "edge2", answer("local/1", true, "u1"), DropForged},
		{"another incarnation of the pod", "edge1", answer("local/1", true, "u0"), DropForged},
		{"a command never sent", "edge1", answer("rebuild/u1/99", false, "u1"), DropForged},
		{"a crafted id", "edge1", answer("local/default/w/u1/1/", false, "u1"), DropForged},
		{"a pod the API server does not have", "edge1", &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: "nobody", PodUid: "u9", Local: true}, DropUnknownPod},
	}
	for _, f := range forged {
		before := b.dropped(f.reason)
		b.result(f.node, f.result, now)
		if b.dropped(f.reason) != before+1 {
			t.Errorf("%s: not dropped as %s", f.name, f.reason)
		}
	}
	if got := b.tr.TakeActions("default", "w"); len(got) != 0 {
		t.Fatalf("forged results taken: %v", got)
	}
	b.result("edge1", answer(id, false, "u1"), now)
	b.result("edge1", answer(id, false, "u1"), now) // a QoS 1 duplicate
	if got := b.tr.TakeActions("default", "w"); len(got) != 1 {
		t.Errorf("%d results taken, want the one answer", len(got))
	}
}

// [P-AUTH-3] A node's report is taken only if a pod of its worker is bound to the node; the workload it counts
// for is that pod's, whatever ownerName and ownerKind the body says (Sedna's library sends "sedna" from a JI
// worker), and a body that names none of several such workloads is dropped.
func TestReportCountsForItsWorkersPod(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.pods[podRef{"default", "svc-edge-1"}] = PodInfo{Node: "edge1", UID: "e1", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}
	b.cutOff("edge1", now)
	b.cutOff("edge2", now)
	body := func(worker, owner, kind string, n int) string {
		return fmt.Sprintf(`{"name":%q,"namespace":"default","ownerName":%q,"ownerKind":%q,"kind":"inference","results":[],"ownerInfo":{"inferenceNumber":%d}}`,
			worker, owner, kind, n)
	}
	b.report("edge2", 1, "default", "svc-edge", body("svc-edge", "svc", "jointinferenceservice", 1), now)
	b.report("edge1", 1, "default", "nobody", body("nobody", "svc", "jointinferenceservice", 2), now)
	if b.dropped(DropForged) != 1 || b.dropped(DropUnknownPod) != 1 {
		t.Errorf("%v forged and %v of unknown pods, want 1 and 1", b.dropped(DropForged), b.dropped(DropUnknownPod))
	}
	if reps := b.tr.Reports("JointInferenceService", "default", "svc"); reps != nil {
		t.Errorf("kept another node's or an unknown worker's report: %+v", reps)
	}
	b.report("edge1", 2, "default", "svc-edge", body("svc-edge", "sedna", "jointinferenceservice", 3), now)
	if n := inferences(b.tr.Reports("JointInferenceService", "default", "svc")); n != 3 {
		t.Errorf("%v inferences, want the report Sedna's library sends (ownerName sedna) kept for svc", n)
	}
	if got := b.tr.Reports("JointInferenceService", "default", "sedna"); got != nil {
		t.Errorf("reports kept under the body's ownerName: %v", got)
	}

	// Two workloads' pods of one WORKER_NAME on the node: the body must name one.
	b.pods[podRef{"default", "other-edge-1"}] = PodInfo{Node: "edge1", UID: "o1", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "other"}
	b.report("edge1", 3, "default", "svc-edge", body("svc-edge", "sedna", "jointinferenceservice", 4), now)
	if b.dropped(DropForged) != 2 {
		t.Errorf("%v forged, want the ambiguous report dropped too", b.dropped(DropForged))
	}
	b.report("edge1", 4, "default", "svc-edge", body("svc-edge", "other", "jointinferenceservice", 5), now)
	if n := inferences(b.tr.Reports("JointInferenceService", "default", "other")); n != 5 {
		t.Errorf("%v inferences kept for other, want the report that names it", n)
	}
}

// inferences is the inferenceNumber of a workload's only report, -1 unless it has exactly one.
func inferences(reps []Report) float64 {
	if len(reps) != 1 {
		return -1
	}
	n, _ := reps[0].OwnerInfo["inferenceNumber"].(float64)
	return n
}

// The table forgets by the controller's clock: a result stamped with a far-future time by its node is
// forgotten an hour after it arrived like any other.
func TestFarFutureTimeIsPruned(t *testing.T) {
	b := newBench(t)
	then := time.Unix(1000, 0)
	b.addPod("edge1", "default", "w", "u")
	b.cutOff("edge1", then)
	b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: "w", PodUid: "u", Local: true,
		TimeUnixNano: time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}, then)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1,
		ObservedUnixNano: time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}, then)
	delete(b.pods, podRef{"default", "w"})
	b.tr.prune(then.Add(2 * time.Hour))
	if len(b.tr.actions) != 0 || b.workers("edge1") != 0 || b.tr.nodes["edge1"].results != 0 {
		t.Errorf("after an hour: %d results (%d counted), %d states left, want none",
			len(b.tr.actions), b.tr.nodes["edge1"].results, b.workers("edge1"))
	}
}

// A node flooding states of pods the API server does not know gets at most maxPendingPerNode of them kept,
// for pendingFor; the rest are dropped and counted.
func TestStatesOfUnknownPodsAreBounded(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.cutOff("edge1", now)
	const flood = 5000
	for i := range flood {
		b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: fmt.Sprintf("fake-%d", i), Uid: "u", Seq: 1}, now)
	}
	if got := b.workers("edge1"); got != maxPendingPerNode {
		t.Errorf("%d records held after %d states of unknown pods, want %d", got, flood, maxPendingPerNode)
	}
	if got := b.dropped(DropOverflow); got != flood-maxPendingPerNode {
		t.Errorf("%v dropped for overflow, want %d", got, flood-maxPendingPerNode)
	}
	b.tr.tick(now.Add(pendingFor / 2))
	if got := b.workers("edge1"); got != maxPendingPerNode {
		t.Errorf("%d records before their time is up, want %d", got, maxPendingPerNode)
	}
	b.tr.tick(now.Add(2 * pendingFor))
	if got := b.workers("edge1"); got != 0 {
		t.Errorf("%d records of unknown pods after %s, want none", got, 2*pendingFor)
	}
	if got := b.dropped(DropUnknownPod); got != maxPendingPerNode {
		t.Errorf("%v forgotten as unknown pods, want %d", got, maxPendingPerNode)
	}
	if len(b.tr.pending) != 0 || b.tr.nodes["edge1"].pending != 0 {
		t.Errorf("pending bookkeeping left: %d, %d", len(b.tr.pending), b.tr.nodes["edge1"].pending)
	}
}

// The controller's cache can lag a new pod by a moment: the first state of the pod, arrived before the cache
// knew it, is kept, and kept for good once the cache binds the pod to the node.
func TestFirstStateOfNewPodSurvivesCacheLag(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.cutOff("edge1", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "new", Uid: "u", Seq: 1, Phase: lifelinev1.Phase_PHASE_RUNNING}, now)
	pod := b.addPod("edge1", "default", "new", "u") // the cache catches up
	b.tr.tick(now.Add(time.Second))
	b.tr.tick(now.Add(time.Hour))
	b.heartbeat("edge1", 1, 2, false, now.Add(time.Hour))
	if v := b.tr.ViewOf(pod, false, now.Add(time.Hour)); v.Truth != TruthAgent || v.State.Phase != lifelinev1.Phase_PHASE_RUNNING {
		t.Errorf("view %+v an hour later, want the agent's first state", v)
	}
	if b.tr.nodes["edge1"].pending != 0 {
		t.Errorf("the state is still pending after the cache knew its pod")
	}
}

// A node can keep only so many results and reports waiting; the excess is dropped and counted.
func TestResultsAndReportsBoundedPerNode(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.cutOff("edge1", now)
	const flood = 1000
	for i := range flood {
		name := fmt.Sprintf("w%d", i)
		b.pods[podRef{"default", name}] = PodInfo{Node: "edge1", UID: name, Worker: name, OwnerKind: "FederatedLearningJob", OwnerName: name}
		b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: name, PodUid: name, Local: true}, now)
		b.report("edge1", uint64(i+1), "default", name,
			fmt.Sprintf(`{"name":%q,"namespace":"default","ownerName":%q,"ownerKind":"federatedlearningjob"}`, name, name), now)
	}
	results, reports := 0, 0
	for _, r := range b.tr.actions {
		results += len(r)
	}
	for _, r := range b.tr.reports {
		reports += len(r)
	}
	if results != maxResultsPerNode || reports != maxReportsPerNode {
		t.Errorf("held %d results and %d reports of %d each, want %d and %d", results, reports, flood, maxResultsPerNode, maxReportsPerNode)
	}
	if got := b.dropped(DropOverflow); got != 2*flood-maxResultsPerNode-maxReportsPerNode {
		t.Errorf("%v dropped for overflow", got)
	}
	b.tr.TakeActions("default", "w0")
	b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/2", Namespace: "default", Pod: "w999", PodUid: "w999", Local: true}, now)
	if len(b.tr.actions[podRef{"default", "w999"}]) != 1 {
		t.Errorf("a result taken did not make room for another")
	}
}

// A report cannot grow a workload's status: keys, key and value lengths, results and the body are bounded.
func TestReportMetricsAreBounded(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.pods[podRef{"default", "svc-edge-1"}] = PodInfo{Node: "edge1", UID: "e1", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}
	b.pods[podRef{"default", "t0"}] = PodInfo{Node: "edge1", UID: "t0", Worker: "t0", OwnerKind: "FederatedLearningJob", OwnerName: "job"}
	b.cutOff("edge1", now)
	var info, round []string
	for i := range 3000 {
		info = append(info, fmt.Sprintf(`"k%04d":%d`, i, i))
	}
	for i := range 40 {
		round = append(round, fmt.Sprintf(`"m%02d":%d`, i, i))
	}
	info = append(info, `"`+strings.Repeat("k", 1000)+`":1`, `"zlong":"`+strings.Repeat("é", 1000)+`"`, `"znested":{"a":[1,2,3]}`)
	b.report("edge1", 1, "default", "svc-edge", `{"name":"svc-edge","namespace":"default","ownerName":"svc","ownerKind":"jointinferenceservice","ownerInfo":{`+strings.Join(info, ",")+`}}`, now)
	kept := b.tr.Reports("JointInferenceService", "default", "svc")
	if len(kept) != 1 || len(kept[0].OwnerInfo) != MaxMetrics {
		t.Fatalf("%d reports kept, want 1 with %d metrics", len(kept), MaxMetrics)
	}
	for k, v := range kept[0].OwnerInfo {
		if s, _ := v.(string); len(k) > maxMetricKeyLen || len(s) > maxMetricValueLen {
			t.Errorf("metric %q of %d bytes", k[:10], len(s))
		}
	}
	var results []string
	for range 30 {
		results = append(results, `{"format":"`+strings.Repeat("f", 300)+`","url":"/m","metrics":{`+strings.Join(round, ",")+`,"zlist":[`+
			strings.Repeat("0.5,", 100)+`0.5]}}`)
	}
	b.report("edge1", 2, "default", "t0", `{"name":"t0","namespace":"default","ownerName":"job","ownerKind":"default","ownerInfo":{"currentRound":99},"results":[`+
		strings.Join(results, ",")+`]}`, now)
	reps := b.tr.Reports("FederatedLearningJob", "default", "job")
	if len(reps) != 1 || reps[0].OwnerInfo["currentRound"] != float64(99) || len(reps[0].Results) != maxResults {
		t.Fatalf("reports kept %+v, want one of round 99 with %d results", reps, maxResults)
	}
	if res := reps[0].Results[0]; len(res.Format) != maxMetricValueLen || len(res.Metrics) != MaxMetrics {
		t.Errorf("a result kept with a format of %d bytes and %d metrics", len(res.Format), len(res.Metrics))
	}
	before := b.dropped(DropDecode)
	b.report("edge1", 3, "default", "t0", `{"name":"t0","namespace":"default","ownerName":"job","ownerKind":"federatedlearningjob","status":"`+
		strings.Repeat("x", lifelinev1.MaxReportBodyBytes)+`"}`, now)
	if b.dropped(DropDecode) != before+1 {
		t.Errorf("a report over %d bytes was not dropped", lifelinev1.MaxReportBodyBytes)
	}
}
