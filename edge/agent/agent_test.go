package agent

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

type recordingActuator struct {
	mu        sync.Mutex
	restarted []string
	fail      error
}

func (a *recordingActuator) Restart(_ context.Context, ns, pod, uid string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.restarted = append(a.restarted, ns+"/"+pod+"/"+uid)
	return a.fail
}

type recordingRebuilder struct {
	mu       sync.Mutex
	rebuilt  []string
	released int
	standIns []core.StandIn
	armed    []int
	armErr   error // what Arm returns
}

func (r *recordingRebuilder) Rebuild(_ context.Context, ns, pod, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rebuilt = append(r.rebuilt, ns+"/"+pod)
	r.standIns = append(r.standIns, core.StandIn{Namespace: ns, Pod: pod})
	return nil
}

func (r *recordingRebuilder) StandIns() ([]core.StandIn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.standIns), nil
}

func (r *recordingRebuilder) Release(ns, pod string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released++
	r.standIns = slices.DeleteFunc(r.standIns, func(s core.StandIn) bool { return s.Namespace == ns && s.Pod == pod })
	return nil
}

// Arm records each arming, as standin.StaticPods.Arm is called: the number of workers it was given.
func (r *recordingRebuilder) Arm(_ context.Context, workers []desired.Worker) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = append(r.armed, len(workers))
	return r.armErr
}

func (r *recordingRebuilder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.rebuilt...)
}

// memPublisher keeps what it is given; tests that run loops read it through snapshot.
type memPublisher struct {
	mu      sync.Mutex
	entries []journal.Entry
	birth   uint64
}

func (p *memPublisher) Enqueue(e journal.Entry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.entries = append(p.entries, e)
	return nil
}

func (p *memPublisher) BirthSeq() uint64 { return max(p.birth, 4) }

func (p *memPublisher) snapshot() []journal.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]journal.Entry(nil), p.entries...)
}

// results decodes the results published so far.
func (p *memPublisher) results(t *testing.T) []*lifelinev1.CommandResult {
	t.Helper()
	var out []*lifelinev1.CommandResult
	for _, e := range p.snapshot() {
		if strings.HasSuffix(e.Topic, "/results") {
			res := &lifelinev1.CommandResult{}
			if err := proto.Unmarshal(e.Payload, res); err != nil {
				t.Fatal(err)
			}
			out = append(out, res)
		}
	}
	return out
}

// lastState decodes the latest worker state published.
func (p *memPublisher) lastState(t *testing.T) *lifelinev1.WorkerState {
	t.Helper()
	entries := p.snapshot()
	for i := len(entries) - 1; i >= 0; i-- {
		if strings.Contains(entries[i].Topic, "/workers/") && len(entries[i].Payload) > 0 {
			ws := &lifelinev1.WorkerState{}
			if err := proto.Unmarshal(entries[i].Payload, ws); err != nil {
				t.Fatal(err)
			}
			return ws
		}
	}
	t.Fatal("no worker state published")
	return nil
}

type fixedWorkers []desired.Worker

func (f fixedWorkers) Workers() []desired.Worker { return f }

// podsSource is a runtime whose answer the test sets.
type podsSource struct{ pods []cri.Pod }

func (s *podsSource) Pods(context.Context) ([]cri.Pod, error) { return s.pods, nil }

func openJournal(t *testing.T) *journal.Journal {
	t.Helper()
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func newAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	if cfg.Cluster == "" {
		cfg.Cluster, cfg.Node = "c", "edge-1"
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

var (
	oneWorker = fixedWorkers{{Namespace: "default", Name: "w", UID: "u", RestartPolicy: "Never"}}
	deadPod   = []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Exited: true, ExitCode: 1}}}}
)

// [P-CMD-3] A command's lifetime runs from its receipt on the agent's clock: a controller whose clock is an
// hour off changes nothing; a redelivery within the lifetime is a duplicate by its id, kept in the journal;
// past receipt + ttl the id is forgotten and the episode still fences a replay.
func TestCommandLifetimeIsMeasuredFromReceiptOnTheAgentsClock_P_CMD_3(t *testing.T) {
	agentClock := time.Now().Add(time.Hour) // the node's clock is an hour ahead of the controller's
	act, pub := &recordingActuator{}, &memPublisher{}
	a := newAgent(t, Config{Source: &podsSource{pods: deadPod}, Workers: oneWorker, Publisher: pub, Store: openJournal(t), Actuator: act,
		Now: func() time.Time { return agentClock }})
	if err := a.ObserveOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	payload, _ := proto.Marshal(&lifelinev1.Command{Id: "restart/u/1", Namespace: "default", Pod: "w", PodUid: "u", Epoch: pub.lastState(t).Episode,
		Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 30000})
	result := func() *lifelinev1.CommandResult {
		t.Helper()
		if err := a.CommandOnce(context.Background(), payload); err != nil {
			t.Fatal(err)
		}
		res := pub.results(t)
		return res[len(res)-1]
	}
	if got := result(); got.Outcome != lifelinev1.Outcome_OUTCOME_DONE {
		t.Fatalf("fresh command: %v", got)
	}
	agentClock = agentClock.Add(29 * time.Second)
	if got := result(); got.Outcome != lifelinev1.Outcome_OUTCOME_DUPLICATE || got.Message != "command already executed" {
		t.Errorf("redelivered within its lifetime: %v, want DUPLICATE by its id", got)
	}
	agentClock = agentClock.Add(2 * time.Second)
	if got := result(); got.Outcome != lifelinev1.Outcome_OUTCOME_DUPLICATE || !strings.Contains(got.Message, "episode") {
		t.Errorf("replayed past its lifetime: %v, want DUPLICATE by its episode", got)
	}
	if len(act.restarted) != 1 {
		t.Errorf("restarted %d times, want once", len(act.restarted))
	}
}

// [P-CMD-3] A command redelivered after the agent restarted is not executed again: claims live in the journal.
func TestCommandIsExecutedOnceAcrossAgentRestarts_P_CMD_3(t *testing.T) {
	j := openJournal(t)
	act := &recordingActuator{}
	var outcomes []lifelinev1.Outcome
	for range 2 { // two lives of the agent, one journal
		pub := &memPublisher{}
		a := newAgent(t, Config{Source: &podsSource{pods: deadPod}, Workers: oneWorker, Publisher: pub, Store: j, Actuator: act})
		if err := a.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		payload, _ := proto.Marshal(&lifelinev1.Command{Id: "once", Namespace: "default", Pod: "w", PodUid: "u", Epoch: pub.lastState(t).Episode,
			Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 60000})
		if err := a.CommandOnce(context.Background(), payload); err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, pub.results(t)[0].Outcome)
	}
	if len(act.restarted) != 1 || outcomes[0] != lifelinev1.Outcome_OUTCOME_DONE || outcomes[1] != lifelinev1.Outcome_OUTCOME_DUPLICATE {
		t.Errorf("restarts %v, outcomes %v; want one restart, DONE then DUPLICATE", act.restarted, outcomes)
	}
}

// [P-BAD-1] A malformed command is dropped: no result (there is no id to answer), an error for the log. A
// failed action is answered FAILED with the actuator's error.
func TestFailedActionAndMalformedCommand(t *testing.T) {
	act, pub := &recordingActuator{fail: errors.New("runtime down")}, &memPublisher{}
	a := newAgent(t, Config{Source: &podsSource{pods: deadPod}, Workers: oneWorker, Publisher: pub, Actuator: act})
	if err := a.ObserveOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	payload, _ := proto.Marshal(&lifelinev1.Command{Id: "x", Namespace: "default", Pod: "w", PodUid: "u", Epoch: pub.lastState(t).Episode,
		Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 60000})
	if err := a.CommandOnce(context.Background(), payload); err != nil {
		t.Fatal(err)
	}
	if res := pub.results(t); len(res) != 1 || res[0].Outcome != lifelinev1.Outcome_OUTCOME_FAILED || res[0].Message != "runtime down" {
		t.Errorf("results %v", res)
	}
	if err := a.CommandOnce(context.Background(), []byte{0xff, 0x01}); err == nil || len(pub.results(t)) != 1 {
		t.Errorf("a malformed command was not dropped: %v, %d results", err, len(pub.results(t)))
	}
}

// [P-WS-2] [P-WS-3] A restarted agent continues the seq and the episode of a death it saw before its restart
// (the journal keeps them), so the controller, which commands once per episode, does not command the same
// death again; a worker that came back and died again meanwhile (more restarts) is a new episode.
func TestEpisodeContinuesAcrossAgentRestarts_P_WS_3(t *testing.T) {
	j := openJournal(t)
	workers := fixedWorkers{{Namespace: "default", Name: "w", UID: "u"}}
	dead := func(attempt uint32) []cri.Pod {
		return []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Exited: true, ExitCode: 1, Attempt: attempt}}}}
	}
	src := &podsSource{pods: []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Running: true}}}}}
	life := func() (*Agent, *memPublisher) {
		pub := &memPublisher{}
		return newAgent(t, Config{Source: src, Workers: workers, Publisher: pub, Store: j}), pub
	}
	latest := func(a *Agent, pub *memPublisher) *lifelinev1.WorkerState {
		t.Helper()
		if err := a.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return pub.lastState(t)
	}
	a, pub := life()
	latest(a, pub)
	src.pods = dead(0)
	death := latest(a, pub)

	a, pub = life() // the agent restarts; the worker is still dead
	if again := latest(a, pub); again.Episode != death.Episode || again.Seq <= death.Seq {
		t.Errorf("after a restart the dead worker's state %d has episode %d, want the death's %d and a greater seq than %d",
			again.Seq, again.Episode, death.Episode, death.Seq)
	}
	a, pub = life() // restarts again; meanwhile edged started the worker and it died again
	src.pods = dead(1)
	if next := latest(a, pub); next.Episode == death.Episode || next.Episode != next.Seq {
		t.Errorf("a new death after a restart has episode %d (state %d), want a new one", next.Episode, next.Seq)
	}
}

// [P-HEAL-1] [P-HEAL-3] The loop rebuilds a lost worker on a node cut off from everything, reports it, and
// hands it back once the worker's own pod runs again, on the agent's clock: not when the API server is back.

func TestAgentRebuildsALostWorkerAndHandsItBack_P_HEAL_3(t *testing.T) {
	reachable, now := true, time.Unix(1000, 0)
	src := &podsSource{pods: []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Running: true}}}}}
	rebuild, pub := &recordingRebuilder{}, &memPublisher{}
	a := newAgent(t, Config{Source: src, Workers: fixedWorkers{{Namespace: "default", Name: "w", UID: "u"}}, Publisher: pub, Rebuilder: rebuild,
		APIReachable: func() bool { return reachable }, Timing: core.DefaultHealTiming, Now: func() time.Time { return now }})
	ctx := context.Background()
	steps := func(n int) {
		for range n {
			now = now.Add(500 * time.Millisecond)
			if err := a.ObserveOnce(ctx); err != nil {
				t.Fatal(err)
			}
			a.TickOnce(ctx)
		}
	}
	steps(1)
	reachable = false
	steps(12) // past the API grace
	src.pods = nil
	steps(3)
	if got := rebuild.snapshot(); len(got) != 1 || got[0] != "default/w" {
		t.Fatalf("rebuilt %v, want the lost worker once", got)
	}
	if res := pub.results(t); len(res) != 1 || !res[0].Local || res[0].Outcome != lifelinev1.Outcome_OUTCOME_DONE || res[0].PodUid != "u" {
		t.Errorf("results %v, want one local DONE for the worker", res)
	}
	if n := a.OfflineRebuilds(); n != 1 {
		t.Errorf("counted %d offline rebuilds, want 1", n)
	}
	if len(rebuild.armed) != 1 || rebuild.armed[0] != 1 {
		t.Errorf("armed %v: want once, with the worker, in the step before the cut, and never while cut off", rebuild.armed)
	}
	reachable = true
	steps(4)
	if rebuild.released != 0 {
		t.Errorf("released %d times while the worker's pod does not run, want none", rebuild.released)
	}
	src.pods = []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Running: true, Attempt: 1}}}}
	steps(1)
	if rebuild.released != 1 {
		t.Errorf("released %d times once the worker's pod runs, want once", rebuild.released)
	}
}

// Arming stand-ins is tried at every tick; a failure that persists (a full disk, a directory the agent may not
// write) is logged when it begins and when it changes, not twice a second.
func TestAgentLogsAPersistentArmingFailureOnce(t *testing.T) {
	var logs lockedLines
	rebuild := &recordingRebuilder{armErr: errors.New("disk full")}
	a := newAgent(t, Config{Source: &podsSource{}, Workers: fixedWorkers{{Namespace: "default", Name: "w", UID: "u"}},
		Publisher: &memPublisher{}, Rebuilder: rebuild, APIReachable: func() bool { return true }, Log: logs.logger()})
	ticks := func(n int) {
		for range n {
			a.TickOnce(context.Background())
		}
	}
	ticks(5)
	rebuild.armErr = errors.New("permission denied")
	ticks(5)
	rebuild.armErr = nil
	ticks(5)
	if len(rebuild.armed) != 15 {
		t.Errorf("armed %d times in 15 ticks, want every tick", len(rebuild.armed))
	}
	if full, denied, again := logs.count("disk full"), logs.count("permission denied"), logs.count("stand-ins armed again"); full != 1 || denied != 1 || again != 1 {
		t.Errorf("logged disk full %d, permission denied %d, armed again %d times; want each once", full, denied, again)
	}
}
