package liveness

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// [P-WS-2] [P-DEATH-2] [P-AUTH-3] The table takes what is new and true, and drops and counts the rest.
func TestTrackerDropsWhatIsOldForgedOrGarbage(t *testing.T) {
	tr, err := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	msg := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	state := func(ns, name string, seq uint64, phase lifelinev1.Phase) []byte {
		return msg(&lifelinev1.WorkerState{Namespace: ns, Name: name, Uid: "u1", Seq: seq, Phase: phase})
	}
	worker := "lifeline/v1/c/nodes/edge1/workers/default/w"
	steps := []struct {
		name, topic string
		payload     []byte
		dropped     string // "" means accepted
	}{
		{"heartbeat before any birth", "lifeline/v1/c/nodes/edge1/heartbeat", msg(&lifelinev1.Heartbeat{BirthSeq: 0, Seq: 1}), DropUnknown},
		{"birth", "lifeline/v1/c/nodes/edge1/birth", msg(&lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 5}), ""},
		{"birth naming another node", "lifeline/v1/c/nodes/edge1/birth", msg(&lifelinev1.NodeBirth{Node: "edge2", BirthSeq: 6}), DropForged},
		{"heartbeat", "lifeline/v1/c/nodes/edge1/heartbeat", msg(&lifelinev1.Heartbeat{BirthSeq: 5, Seq: 1, ApiReachable: true}), ""},
		{"replayed heartbeat", "lifeline/v1/c/nodes/edge1/heartbeat", msg(&lifelinev1.Heartbeat{BirthSeq: 5, Seq: 1}), DropReplayed},
		{"worker state", worker, state("default", "w", 3, lifelinev1.Phase_PHASE_RUNNING), ""},
		{"older worker state", worker, state("default", "w", 2, lifelinev1.Phase_PHASE_FAILED), DropReplayed},
		{"state of another pod on this topic", worker, state("default", "x", 9, lifelinev1.Phase_PHASE_FAILED), DropForged},
		{"garbage payload", worker, []byte{0xff, 0xff, 0xff}, DropDecode},
		{"garbage topic", "lifeline/v1/c/nodes/Edge_1/heartbeat", nil, DropTopic},
		{"another cluster", "lifeline/v1/other/nodes/edge1/heartbeat", nil, DropTopic},
		{"a command from a node", "lifeline/v1/c/nodes/edge1/results/x", nil, DropTopic},
		{"late death of an older birth", "lifeline/v1/c/nodes/edge1/death", msg(&lifelinev1.NodeDeath{Node: "edge1", BirthSeq: 4}), DropReplayed},
		{"newer worker state", worker, state("default", "w", 4, lifelinev1.Phase_PHASE_FAILED), ""},
	}
	for _, s := range steps {
		before := testutil.ToFloat64(tr.dropped.WithLabelValues(s.dropped))
		tr.Ingest(s.topic, s.payload, now)
		if s.dropped != "" && testutil.ToFloat64(tr.dropped.WithLabelValues(s.dropped)) != before+1 {
			t.Errorf("%s: not counted as dropped (%s)", s.name, s.dropped)
		}
	}
	var total float64
	for _, r := range []string{DropTopic, DropDecode, DropForged, DropReplayed, DropUnknown} {
		total += testutil.ToFloat64(tr.dropped.WithLabelValues(r))
	}
	if total != 10 {
		t.Errorf("%v messages dropped, want 10", total)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "u1"}, Spec: corev1.PodSpec{NodeName: "edge1"}}
	v := tr.ViewOf(pod, false, now.Add(time.Second))
	if v.Truth != TruthAPIServer {
		t.Errorf("truth %s while the agent reaches the API server, want APIServer", v.Truth)
	}
	tr.Ingest("lifeline/v1/c/nodes/edge1/heartbeat", msg(&lifelinev1.Heartbeat{BirthSeq: 5, Seq: 2, ApiReachable: false}), now)
	v = tr.ViewOf(pod, false, now.Add(time.Second))
	if v.Truth != TruthAgent || v.State.Seq != 4 || v.State.Phase != lifelinev1.Phase_PHASE_FAILED {
		t.Errorf("view %+v, want the agent's seq 4 FAILED (the forged and the old states were not taken)", v)
	}
	if v := tr.ViewOf(pod, false, now.Add(10*time.Second)); v.Truth != TruthUnknown {
		t.Errorf("truth %s after the agent went silent on a NotReady node, want Unknown", v.Truth)
	}
}

func TestWhoseTruth(t *testing.T) {
	cases := []struct {
		nodeReady, agentOnline, agentReachesAPI, agentKnowsPod bool
		want                                                   Truth
	}{
		{true, true, true, true, TruthAPIServer},
		{false, true, true, true, TruthAPIServer},
		{true, true, false, true, TruthAgent},
		{false, true, false, true, TruthAgent},
		{true, true, false, false, TruthUnknown},
		{true, false, false, false, TruthAPIServer},
		{false, false, false, true, TruthUnknown},
	}
	for _, c := range cases {
		if got := whoseTruth(c.nodeReady, c.agentOnline, c.agentReachesAPI, c.agentKnowsPod); got != c.want {
			t.Errorf("whoseTruth(ready=%v online=%v reaches=%v knows=%v) = %s, want %s", c.nodeReady, c.agentOnline,
				c.agentReachesAPI, c.agentKnowsPod, got, c.want)
		}
	}
}

// [P-CMD-2] A restart is fenced by the pod UID and the episode of the state it answers, and sent once.
func TestHealDeadIsFencedAndSentOnce(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	pod := b.addPod("edge1", "default", "w", "u1")
	b.cutOff("edge1", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u1", Seq: 7, Episode: 7, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	dead := b.tr.ViewOf(pod, false, now)
	id, err := b.tr.HealDead(b.out, pod, dead, true, now)
	if err != nil || id != "rebuild/u1/7" {
		t.Fatalf("command %q sent, %v; want rebuild/u1/7", id, err)
	}
	cmd := b.out.sent[0]
	if b.out.to[0] != "edge1" || cmd.PodUid != "u1" || cmd.Epoch != 7 || cmd.Action != lifelinev1.Action_ACTION_REBUILD || cmd.TtlMillis != 30000 {
		t.Errorf("command %v to %s", cmd, b.out.to[0])
	}
	if again, _ := b.tr.HealDead(b.out, pod, dead, true, now.Add(time.Minute)); again != "" {
		t.Errorf("the same decision sent twice (%s)", again)
	}
	for name, v := range map[string]View{
		"API server's truth": {Truth: TruthAPIServer},
		"running":            {Truth: TruthAgent, State: &lifelinev1.WorkerState{Seq: 8, Episode: 8, Phase: lifelinev1.Phase_PHASE_RUNNING}},
	} {
		if id, _ := b.tr.HealDead(b.out, pod, v, true, now); id != "" {
			t.Errorf("%s: command %s sent", name, id)
		}
	}
	dead.State.Episode = 9
	if id, _ := b.tr.HealDead(b.out, pod, dead, false, now.Add(time.Hour)); id != "" {
		t.Errorf("an offline policy that does not heal: command %s sent", id)
	}
}

// A reader that falls behind loses no change: what piles up is coalesced per pod and delivered.
func TestSubscribersGetEveryChangedPod(t *testing.T) {
	b := newBench(t)
	ch := b.tr.Subscribe()
	now := time.Unix(1000, 0)
	const pods = 3000
	for i := range pods {
		node, name := fmt.Sprintf("edge%d", i%10), fmt.Sprintf("w%d", i)
		b.addPod(node, "default", name, name)
		for seq := uint64(1); seq <= 2; seq++ { // two changes each, read nowhere yet
			b.state(node, &lifelinev1.WorkerState{Namespace: "default", Name: name, Uid: name, Seq: uint64(i)*10 + seq}, now)
		}
	}
	seen := map[string]bool{}
	timeout := time.After(5 * time.Second)
	for len(seen) < pods {
		select {
		case ev := <-ch:
			seen[ev.Object.GetName()] = true
		case <-timeout:
			t.Fatalf("%d of %d changed pods delivered", len(seen), pods)
		}
	}
}

// [P-REP-1] Reports reach the table in seq order, each worker's latest kept for its workload.
func TestReportsAreKeptInSeqOrder(t *testing.T) {
	b := newBench(t)
	tr := b.tr
	for _, w := range []string{"t0", "t1", "t2"} {
		b.pods[podRef{"default", w}] = PodInfo{Node: "edge1", UID: w, Worker: w, OwnerKind: "FederatedLearningJob", OwnerName: "job"}
	}
	b.pods[podRef{"default", "svc-edge-5d8f-x"}] = PodInfo{Node: "edge1", UID: "e", Worker: "svc-edge", OwnerKind: "JointInferenceService", OwnerName: "svc"}
	now := time.Unix(1000, 0)
	birth, _ := proto.Marshal(&lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 1})
	tr.Ingest("lifeline/v1/c/nodes/edge1/birth", birth, now)
	report := func(seq uint64, worker, body string) {
		payload, _ := proto.Marshal(&lifelinev1.WorkerReport{Namespace: "default", Worker: worker, Seq: seq, Body: []byte(body)})
		tr.Ingest("lifeline/v1/c/nodes/edge1/reports", payload, now)
	}
	// As Sedna's trainer sends them: ownerName from JOB_NAME, the library's default ownerKind, the round in
	// ownerInfo, the saved model's metrics in results.
	const fl = `{"name":"%s","namespace":"default","ownerName":"job","ownerKind":"default","kind":"train","status":"running",` +
		`"ownerInfo":{"currentRound":%d,"sampleCount":30,"startTime":"2026-12-01 10:00:00","updateTime":"2026-12-01 10:00:09"},` +
		`"results":[{"format":"pb","url":"/home/data/model/model.pb","metrics":{"loss":%g}}]}`
	report(1, "t0", fmt.Sprintf(fl, "t0", 1, 0.5))
	report(2, "t0", fmt.Sprintf(fl, "t0", 2, 0.3))
	report(3, "t1", fmt.Sprintf(fl, "t1", 2, 0.1))
	report(2, "t1", fmt.Sprintf(fl, "t1", 9, 0.0))         // replayed: an old seq
	report(4, "t1", fmt.Sprintf(fl, "t2", 9, 0.0))         // body names another worker
	report(5, "t3", `{"name":"t3","namespace":"default"}`) // no pod of this worker
	loss := map[string]any{}
	for _, r := range tr.Reports("FederatedLearningJob", "default", "job") {
		if len(r.Results) == 1 && r.OwnerInfo["currentRound"] == float64(2) {
			loss[r.Worker] = r.Results[0].Metrics["loss"]
		}
	}
	if want := map[string]any{"t0": 0.3, "t1": 0.1}; !reflect.DeepEqual(loss, want) {
		t.Errorf("kept the losses %v of round 2, want %v: each worker's latest report, no replayed or forged one", loss, want)
	}
	if got := testutil.ToFloat64(tr.dropped.WithLabelValues(DropReplayed)) + testutil.ToFloat64(tr.dropped.WithLabelValues(DropForged)) +
		testutil.ToFloat64(tr.dropped.WithLabelValues(DropUnknownPod)); got != 3 {
		t.Errorf("%v reports dropped, want 3", got)
	}
	report(6, "svc-edge", `{"name":"svc-edge","namespace":"default","ownerName":"sedna","ownerKind":"jointinferenceservice","kind":"inference","results":[],`+
		`"ownerInfo":{"inferenceNumber":40,"hardExampleNumber":12,"uploadCloudRatio":0.3}}`)
	reps := tr.Reports("JointInferenceService", "default", "svc")
	if len(reps) != 1 || reps[0].Worker != "svc-edge" || reps[0].OwnerInfo["uploadCloudRatio"] != 0.3 {
		t.Errorf("reports of svc %+v, want the edge worker's (its body's ownerName is Sedna's default)", reps)
	}
}

// The table forgets, after an hour, the states of pods the API server no longer has, untaken results and old
// reports; it keeps the states of pods that still exist.
func TestTrackerForgetsWhatNoLongerMatters(t *testing.T) {
	b := newBench(t)
	tr := b.tr
	b.addPod("edge1", "default", "kept", "kept")
	b.addPod("edge1", "default", "gone", "gone")
	b.pods[podRef{"default", "t0"}] = PodInfo{Node: "edge1", UID: "t0", Worker: "t0", OwnerKind: "FederatedLearningJob", OwnerName: "job"}
	then := time.Unix(1000, 0)
	birth, _ := proto.Marshal(&lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 1})
	tr.Ingest("lifeline/v1/c/nodes/edge1/birth", birth, then)
	for i, name := range []string{"kept", "gone"} {
		ws, _ := proto.Marshal(&lifelinev1.WorkerState{Namespace: "default", Name: name, Uid: name, Seq: uint64(i + 1)})
		tr.Ingest("lifeline/v1/c/nodes/edge1/workers/default/"+name, ws, then)
	}
	b.result("edge1", &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: "gone", PodUid: "gone", Local: true,
		TimeUnixNano: then.UnixNano()}, then)
	report, _ := proto.Marshal(&lifelinev1.WorkerReport{Namespace: "default", Worker: "t0", Seq: 1,
		Body: []byte(`{"name":"t0","namespace":"default","ownerName":"job","ownerKind":"federatedlearningjob"}`)})
	tr.Ingest("lifeline/v1/c/nodes/edge1/reports", report, then)
	delete(b.pods, podRef{"default", "gone"})

	tr.prune(then.Add(30 * time.Minute))
	if b.workers("edge1") != 2 || len(tr.actions) != 1 || len(tr.reports) != 1 {
		t.Fatalf("pruned within the hour: %d states, %d results, %d reports", b.workers("edge1"), len(tr.actions), len(tr.reports))
	}
	tr.prune(then.Add(2 * time.Hour))
	if _, kept := tr.nodes["edge1"].workers[podRef{"default", "kept"}]; !kept || b.workers("edge1") != 1 {
		t.Errorf("states after an hour: %v, want only the existing pod's", tr.nodes["edge1"].workers)
	}
	if len(tr.actions) != 0 || len(tr.reports) != 0 {
		t.Errorf("after an hour: %d results, %d reports left, want none", len(tr.actions), len(tr.reports))
	}
}

// [P-WS-4] An empty state on a worker topic (the agent clearing the retained state of a worker that left the
// node) forgets the node's record of that worker, and only that one.
func TestEmptyStateForgetsTheWorker_P_WS_4(t *testing.T) {
	tr, err := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	msg := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	tr.Ingest("lifeline/v1/c/nodes/edge1/birth", msg(&lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 1}), now)
	tr.Ingest("lifeline/v1/c/nodes/edge1/heartbeat", msg(&lifelinev1.Heartbeat{BirthSeq: 1, Seq: 1}), now)
	for _, name := range []string{"left", "stays"} {
		tr.Ingest("lifeline/v1/c/nodes/edge1/workers/default/"+name,
			msg(&lifelinev1.WorkerState{Namespace: "default", Name: name, Uid: "u-" + name, Seq: 1, Phase: lifelinev1.Phase_PHASE_RUNNING}), now)
	}
	tr.Ingest("lifeline/v1/c/nodes/edge1/workers/default/left", nil, now)
	tr.Ingest("lifeline/v1/c/nodes/edge1/workers/default/never-known", nil, now)
	view := func(name string) View {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u-" + name)},
			Spec: corev1.PodSpec{NodeName: "edge1"}}
		return tr.ViewOf(pod, false, now)
	}
	if v := view("left"); v.Truth != TruthUnknown {
		t.Errorf("worker that left: truth %s, want Unknown (its record forgotten)", v.Truth)
	}
	if v := view("stays"); v.Truth != TruthAgent || v.State.Phase != lifelinev1.Phase_PHASE_RUNNING {
		t.Errorf("other worker: %+v, want the agent's RUNNING state kept", v)
	}
	if got := testutil.ToFloat64(tr.received.WithLabelValues("forget")); got != 2 {
		t.Errorf("%v forgets counted, want 2", got)
	}
}

// [P-HB-3] A node on a metered link says a 10 s heartbeat in its birth: it stays online between its heartbeats
// (three of them make its silence window) where a node of the default interval would flap silent; a birth that
// says nothing keeps the default window.
func TestSilenceFollowsTheIntervalTheBirthSays_P_HB_3(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.ingestBirth(&lifelinev1.NodeBirth{Node: "metered", BirthSeq: 1, StateId: "s", BootId: "boot", HeartbeatIntervalMillis: 10000}, now)
	b.birth("default", 1, "s", now)
	online := func(node string, at time.Time) bool {
		b.tr.mu.Lock()
		defer b.tr.mu.Unlock()
		return b.tr.isOnline(b.tr.nodes[node], at)
	}
	for _, step := range []struct {
		after             time.Duration
		metered, standard bool
	}{
		{2 * time.Second, true, true},
		{5 * time.Second, true, false},
		{29 * time.Second, true, false},
		{31 * time.Second, false, false},
	} {
		at := now.Add(step.after)
		if got := online("metered", at); got != step.metered {
			t.Errorf("%v after the birth, node with a 10 s interval online %v, want %v", step.after, got, step.metered)
		}
		if got := online("default", at); got != step.standard {
			t.Errorf("%v after the birth, node with the default interval online %v, want %v", step.after, got, step.standard)
		}
	}
}

// [P-HB-1] An agent heard reaching the API server loses the broker and the API server, and comes back to the
// broker only: its new birth says it is cut off, and the table takes that at once, instead of the last session's
// word until the first heartbeat. A birth that says nothing (an older agent) leaves the last word as it was.
func TestBirthSaysTheNewSessionsReach_P_HB_1(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	reach := func() bool {
		b.tr.mu.Lock()
		defer b.tr.mu.Unlock()
		return b.tr.nodes["edge-1"].apiReachable
	}
	b.birth("edge-1", 1, "s", now)
	b.heartbeat("edge-1", 1, 1, true, now)
	cut := false
	b.ingestBirth(&lifelinev1.NodeBirth{Node: "edge-1", BirthSeq: 2, StateId: "s", BootId: "boot", ApiReachable: &cut}, now.Add(time.Second))
	if reach() {
		t.Error("after a birth saying the node is cut off, the table still says it reaches the API server")
	}
	b.heartbeat("edge-1", 2, 1, true, now.Add(2*time.Second))
	b.birth("edge-1", 3, "s", now.Add(3*time.Second))
	if !reach() {
		t.Error("a birth that says nothing changed the node's last word")
	}
}

// Back from a cut, the API server may still hold the pod as the node posted it before: a trainer that failed
// twice offline still Running with no restart. Until the node posts the pod anew (it then agrees with the agent)
// the agent's word stands, for at most freshAfterReconnect; a pod that agrees is the API server's at once.
func TestStalePodAfterReconnectKeepsTheAgentsWord(t *testing.T) {
	b := newBench(t)
	pod := b.addPod("edge1", "default", "trainer", "u")
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "c", RestartCount: 0}}}
	now := time.Unix(1000, 0)
	b.cutOff("edge1", now)
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "trainer", Uid: "u", Seq: 1,
		Phase: lifelinev1.Phase_PHASE_FAILED, Restarts: 2}, now)
	if v := b.tr.ViewOf(pod, false, now); v.Truth != TruthAgent {
		t.Fatalf("cut off: truth %s, want Agent", v.Truth)
	}
	back := now.Add(10 * time.Second)
	b.heartbeat("edge1", 1, 2, true, back)
	seq := uint64(2)
	for _, step := range []struct {
		what  string
		pod   corev1.PodStatus
		at    time.Duration
		truth Truth
	}{
		{"the link back, the pod as before the cut", pod.Status, time.Second, TruthAgent},
		{"still so 30 s later", pod.Status, 30 * time.Second, TruthAgent},
		{"the node posted the failure, restarts counted", corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", RestartCount: 2}}}, 31 * time.Second, TruthAPIServer},
		{"never posted, past the bound", pod.Status, freshAfterReconnect, TruthAPIServer},
	} {
		seq++
		b.heartbeat("edge1", 1, seq, true, back.Add(step.at)) // the agent heard all along
		p := pod.DeepCopy()
		p.Status = step.pod
		if v := b.tr.ViewOf(p, true, back.Add(step.at)); v.Truth != step.truth {
			t.Errorf("%s: truth %s, want %s", step.what, v.Truth, step.truth)
		}
	}
	// A node the controller never saw cut off: its pods are the API server's from the start.
	fresh := b.addPod("edge2", "default", "other", "o")
	b.birth("edge2", 1, "state-edge2", now)
	b.heartbeat("edge2", 1, 1, true, now)
	b.state("edge2", &lifelinev1.WorkerState{Namespace: "default", Name: "other", Uid: "o", Seq: 1, Phase: lifelinev1.Phase_PHASE_RUNNING}, now)
	if v := b.tr.ViewOf(fresh, true, now); v.Truth != TruthAPIServer {
		t.Errorf("a node never cut off: truth %s, want APIServer", v.Truth)
	}
}

// A node whose link has just come back has rejoined for freshAfterReconnect: its workers are going back to the
// API server's word. A node never cut off, one still cut off, and one whose agent fell silent have not.
func TestRejoinedIsTheLinkBackLately(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.birth("steady", 1, "s", now)
	b.heartbeat("steady", 1, 1, true, now)
	b.cutOff("edge1", now)
	if b.tr.Rejoined("steady", now) || b.tr.Rejoined("edge1", now) || b.tr.Rejoined("unheard", now) {
		t.Error("a node never cut off, a cut-off node or an unheard one has rejoined")
	}
	back := now.Add(10 * time.Second)
	b.heartbeat("edge1", 1, 2, true, back)
	for _, tt := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {freshAfterReconnect - time.Second, true}, {freshAfterReconnect, false}} {
		b.heartbeat("edge1", 1, 3+uint64(tt.after/time.Second), true, back.Add(tt.after)) // heard all along
		if got := b.tr.Rejoined("edge1", back.Add(tt.after)); got != tt.want {
			t.Errorf("%v after the link came back: rejoined %v, want %v", tt.after, got, tt.want)
		}
	}
	if b.tr.Rejoined("edge1", back.Add(time.Hour)) {
		t.Error("a silent node has rejoined")
	}
}
