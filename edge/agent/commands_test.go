package agent

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

type recordingActuator struct {
	restarted []string
	fail      error
}

func (a *recordingActuator) Restart(_ context.Context, ns, pod, uid string) error {
	a.restarted = append(a.restarted, ns+"/"+pod+"/"+uid)
	return a.fail
}

// memPublisher keeps what it is given; tests that run loops read it through snapshot.
type memPublisher struct {
	mu      sync.Mutex
	entries []journal.Entry
}

func (p *memPublisher) Enqueue(e journal.Entry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.entries = append(p.entries, e)
	return nil
}

func (p *memPublisher) BirthSeq() uint64 { return 4 }

func (p *memPublisher) snapshot() []journal.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]journal.Entry(nil), p.entries...)
}

// [P-CMD-2] [P-CMD-3] [P-CMD-4] Each command gets exactly one result, naming its worker; stale, expired and
// repeated ones are refused without acting, and a command acts only on the worker's current episode.
func TestCommandsAreFenced_P_CMD_2(t *testing.T) {
	now := time.Unix(1000, 0)
	restart := func(id, uid string, epoch uint64) *lifelinev1.Command {
		return &lifelinev1.Command{Id: id, Namespace: "default", Pod: "w", PodUid: uid, Epoch: epoch,
			Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 60000}
	}
	expired := restart("c-expired", "uid-1", 7)
	expired.TtlMillis = 0 // no lifetime: expired on receipt
	cases := []struct {
		name    string
		episode uint64 // the worker's current episode when the command arrives
		cmd     *lifelinev1.Command
		want    lifelinev1.Outcome
		actions int
	}{
		{"current episode and uid", 7, restart("c1", "uid-1", 7), lifelinev1.Outcome_OUTCOME_DONE, 1},
		{"the same id again", 7, restart("c1", "uid-1", 7), lifelinev1.Outcome_OUTCOME_DUPLICATE, 0},
		{"another id for the same death", 7, restart("c1-bis", "uid-1", 7), lifelinev1.Outcome_OUTCOME_DUPLICATE, 0},
		{"an older episode", 7, restart("c2", "uid-1", 6), lifelinev1.Outcome_OUTCOME_REFUSED_STALE, 0},
		{"an episode the agent has not seen", 7, restart("c5", "uid-1", 9), lifelinev1.Outcome_OUTCOME_REFUSED_STALE, 0},
		{"another pod of the same name", 7, restart("c3", "uid-0", 7), lifelinev1.Outcome_OUTCOME_REFUSED_STALE, 0},
		{"expired", 7, expired, lifelinev1.Outcome_OUTCOME_REFUSED_EXPIRED, 0},
		{"the worker died again", 9, restart("c4", "uid-1", 9), lifelinev1.Outcome_OUTCOME_DONE, 1},
		{"a command for the previous death", 9, restart("c6", "uid-1", 7), lifelinev1.Outcome_OUTCOME_REFUSED_STALE, 0},
	}
	act := &recordingActuator{}
	pub := &memPublisher{}
	c := &Commands{Cluster: "c", Node: "edge-1", Actuator: act, Publisher: pub, Now: func() time.Time { return now }}
	for _, tc := range cases {
		c.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "uid-1", Seq: tc.episode + 1, Episode: tc.episode,
			Phase: lifelinev1.Phase_PHASE_FAILED})
		before, results := len(act.restarted), len(pub.entries)
		payload, _ := proto.Marshal(tc.cmd)
		if err := c.Handle(context.Background(), payload); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := len(act.restarted) - before; got != tc.actions {
			t.Errorf("%s: %d actions, want %d", tc.name, got, tc.actions)
		}
		if len(pub.entries) != results+1 {
			t.Fatalf("%s: %d results, want exactly one", tc.name, len(pub.entries)-results)
		}
		e := pub.entries[len(pub.entries)-1]
		res := &lifelinev1.CommandResult{}
		if err := proto.Unmarshal(e.Payload, res); err != nil {
			t.Fatal(err)
		}
		if res.CommandId != tc.cmd.Id || res.Outcome != tc.want || e.Topic != "lifeline/v1/c/nodes/edge-1/results" || e.QoS != 1 {
			t.Errorf("%s: result %v on %s, want %s", tc.name, res, e.Topic, tc.want)
		}
		if res.Namespace != "default" || res.Pod != "w" || res.PodUid != tc.cmd.PodUid || res.Local {
			t.Errorf("%s: result names %s/%s (%s) local=%v, want the command's worker", tc.name, res.Namespace, res.Pod, res.PodUid, res.Local)
		}
	}
}

// [P-CMD-3] A command's lifetime runs from its receipt on the agent's clock: a controller whose clock is an
// hour off (the command carries no time of its) changes nothing; a redelivery within the lifetime is a
// duplicate, and the claim is forgotten at receipt + ttl, after which the episode still fences a replay.
func TestCommandLifetimeIsMeasuredFromReceiptOnTheAgentsClock_P_CMD_3(t *testing.T) {
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	controllerClock := time.Now()
	agentClock := controllerClock.Add(time.Hour) // the node's clock is an hour ahead of the controller's
	act := &recordingActuator{}
	pub := &memPublisher{}
	c := &Commands{Cluster: "c", Node: "edge-1", Actuator: act, Publisher: pub, Claims: j, Now: func() time.Time { return agentClock }}
	c.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 3, Episode: 3, Phase: lifelinev1.Phase_PHASE_FAILED})
	payload, _ := proto.Marshal(&lifelinev1.Command{Id: "restart/u/3", Namespace: "default", Pod: "w", PodUid: "u", Epoch: 3,
		Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 30000})
	result := func() *lifelinev1.CommandResult {
		t.Helper()
		if err := c.Handle(context.Background(), payload); err != nil {
			t.Fatal(err)
		}
		res := &lifelinev1.CommandResult{}
		if err := proto.Unmarshal(pub.entries[len(pub.entries)-1].Payload, res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if got := result(); got.Outcome != lifelinev1.Outcome_OUTCOME_DONE {
		t.Fatalf("fresh command: %v", got)
	}
	agentClock = agentClock.Add(29 * time.Second)
	if got := result(); got.Outcome != lifelinev1.Outcome_OUTCOME_DUPLICATE || got.Message != "command already executed" {
		t.Errorf("redelivered within its lifetime: %v, want DUPLICATE by its id", got)
	}
	// Past receipt + ttl the id is forgotten (the journal stays bounded); the episode, acted on already,
	// still keeps a late replay from acting.
	agentClock = agentClock.Add(2 * time.Second)
	if got := result(); got.Outcome != lifelinev1.Outcome_OUTCOME_DUPLICATE || !strings.Contains(got.Message, "episode 3") {
		t.Errorf("replayed past its lifetime: %v, want DUPLICATE by its episode", got)
	}
	if len(act.restarted) != 1 {
		t.Errorf("restarted %d times, want once", len(act.restarted))
	}
}

func TestFailedActionAndMalformedCommand(t *testing.T) {
	act := &recordingActuator{fail: errors.New("runtime down")}
	pub := &memPublisher{}
	c := &Commands{Cluster: "c", Node: "edge-1", Actuator: act, Publisher: pub}
	c.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1, Episode: 1})
	payload, _ := proto.Marshal(&lifelinev1.Command{Id: "x", Namespace: "default", Pod: "w", PodUid: "u", Epoch: 1,
		Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 60000})
	if err := c.Handle(context.Background(), payload); err != nil {
		t.Fatal(err)
	}
	res := &lifelinev1.CommandResult{}
	_ = proto.Unmarshal(pub.entries[0].Payload, res)
	if res.Outcome != lifelinev1.Outcome_OUTCOME_FAILED || res.Message != "runtime down" {
		t.Errorf("result %v", res)
	}
	if err := c.Handle(context.Background(), []byte{0xff, 0x01}); err == nil || len(pub.entries) != 1 {
		t.Errorf("a malformed command was not dropped: %v, %d results", err, len(pub.entries))
	}
}

// [P-CMD-3] A command redelivered after the agent restarted is not executed again: claims live in the journal.
func TestCommandIsExecutedOnceAcrossAgentRestarts_P_CMD_3(t *testing.T) {
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	payload, _ := proto.Marshal(&lifelinev1.Command{Id: "once", Namespace: "default", Pod: "w", PodUid: "u", Epoch: 1,
		Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 60000})
	act := &recordingActuator{}
	var outcomes []lifelinev1.Outcome
	for range 2 { // two lives of the agent, one journal
		pub := &memPublisher{}
		c := &Commands{Cluster: "c", Node: "edge-1", Actuator: act, Publisher: pub, Claims: j}
		c.Observed(&lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1, Episode: 1})
		if err := c.Handle(context.Background(), payload); err != nil {
			t.Fatal(err)
		}
		res := &lifelinev1.CommandResult{}
		_ = proto.Unmarshal(pub.entries[0].Payload, res)
		outcomes = append(outcomes, res.Outcome)
	}
	if len(act.restarted) != 1 || outcomes[0] != lifelinev1.Outcome_OUTCOME_DONE || outcomes[1] != lifelinev1.Outcome_OUTCOME_DUPLICATE {
		t.Errorf("restarts %v, outcomes %v; want one restart, DONE then DUPLICATE", act.restarted, outcomes)
	}
}
