package liveness

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
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
	for _, r := range []string{DropTopic, DropDecode, DropForged, DropReplayed, DropKind, DropUnknown} {
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

func TestApplyAgentView(t *testing.T) {
	seen := time.Unix(2000, 0)
	ws := v1alpha1.WorkerStatus{Phase: "Running", Liveness: v1alpha1.LivenessAlive, Ready: true, Restarts: 1,
		Source: v1alpha1.StatusSourceAPIServer}
	Apply(&ws, View{Truth: TruthAgent, SeenAt: seen, State: &lifelinev1.WorkerState{Phase: lifelinev1.Phase_PHASE_FAILED, Restarts: 3}})
	if ws.Phase != "Failed" || ws.Liveness != v1alpha1.LivenessDead || ws.Ready || ws.Restarts != 3 ||
		ws.Source != v1alpha1.StatusSourceAgent || !ws.LastSeen.Time.Equal(seen) {
		t.Errorf("after the agent's view: %+v", ws)
	}
	Apply(&ws, View{Truth: TruthUnknown})
	if ws.Liveness != v1alpha1.LivenessUnknown || ws.Source != v1alpha1.StatusSourceNone {
		t.Errorf("after an unknown view: %+v", ws)
	}
}

type recordedCommands struct{ payloads map[string][]byte }

func (r *recordedCommands) PublishCommand(node string, payload []byte) error {
	r.payloads[node] = payload
	return nil
}

// [P-CMD-2] A restart is fenced by the pod UID and the seq of the state it answers, and sent once.
func TestRestartDeadIsFencedAndSentOnce(t *testing.T) {
	tr, _ := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	out := &recordedCommands{payloads: map[string][]byte{}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "u1"}, Spec: corev1.PodSpec{NodeName: "edge1"}}
	dead := View{Truth: TruthAgent, State: &lifelinev1.WorkerState{Seq: 7, Phase: lifelinev1.Phase_PHASE_FAILED}}
	now := time.Unix(1000, 0)
	id, err := tr.RestartDead(out, pod, dead, now)
	if err != nil || id == "" {
		t.Fatalf("no command sent: %v", err)
	}
	cmd := &lifelinev1.Command{}
	if err := proto.Unmarshal(out.payloads["edge1"], cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.PodUid != "u1" || cmd.Epoch != 7 || cmd.Action != lifelinev1.Action_ACTION_RESTART || cmd.ExpiresUnixNano <= now.UnixNano() {
		t.Errorf("command %v", cmd)
	}
	if again, _ := tr.RestartDead(out, pod, dead, now); again != "" {
		t.Errorf("the same decision sent twice (%s)", again)
	}
	for name, v := range map[string]View{
		"API server's truth": {Truth: TruthAPIServer},
		"running":            {Truth: TruthAgent, State: &lifelinev1.WorkerState{Seq: 8, Phase: lifelinev1.Phase_PHASE_RUNNING}},
	} {
		if id, _ := tr.RestartDead(out, pod, v, now); id != "" {
			t.Errorf("%s: command %s sent", name, id)
		}
	}
	pod.Annotations = map[string]string{"lifeline.sedna.io/offline-policy": "None"}
	dead.State.Seq = 9
	if id, _ := tr.RestartDead(out, pod, dead, now); id != "" {
		t.Errorf("offline policy None: command %s sent", id)
	}
}

// A reader that falls behind loses no change: what piles up is coalesced per pod and delivered.
func TestSubscribersGetEveryChangedPod(t *testing.T) {
	tr, _ := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	ch := tr.Subscribe()
	now := time.Unix(1000, 0)
	const pods = 3000
	for i := range pods {
		name := fmt.Sprintf("w%d", i)
		for seq := uint64(1); seq <= 2; seq++ { // two changes each, read nowhere yet
			payload, _ := proto.Marshal(&lifelinev1.WorkerState{Namespace: "default", Name: name, Seq: uint64(i)*10 + seq})
			tr.Ingest("lifeline/v1/c/nodes/edge1/workers/default/"+name, payload, now)
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
