package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/fakecri"
	"github.com/lifeline-edge/lifeline/test/mqtttest"
)

// rig is an agent assembled as cmd/lifeline-agent assembles it — CRI runtime, journal, MQTT session, observer and
// command handler — against a fake runtime on a real unix socket and an embedded broker.
type rig struct {
	runtime  *fakecri.Runtime
	broker   string
	received <-chan mqtttest.Message
}

func startRig(t *testing.T, containers ...fakecri.Container) *rig {
	t.Helper()
	dir := t.TempDir()
	rt, err := fakecri.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Stop)
	for _, c := range containers {
		rt.Set(c)
	}
	runtime, err := cri.Dial(rt.Socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { runtime.Close() })
	broker := mqtttest.StartBroker(t)
	received := mqtttest.Subscribe(t, broker, "c", "controller")
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cmds := &Commands{Cluster: "c", Node: "edge-1", Actuator: &CRIActuator{Runtime: runtime, Grace: time.Second}}
	pub := publisher.New(publisher.Config{Broker: "tcp://" + broker, Cluster: "c", Node: "edge-1", StateDir: dir,
		RetryInterval: 50 * time.Millisecond, Log: logr.Discard(),
		OnCommand: func(payload []byte) { _ = cmds.Handle(ctx, payload) }}, j)
	cmds.Publisher = pub
	go pub.Run(ctx)
	obs := &Observer{Cluster: "c", Node: "edge-1", Source: runtime, Publisher: pub, Seq: j,
		Interval: 100 * time.Millisecond, Log: logr.Discard(), OnPublished: cmds.Observed}
	go obs.Run(ctx)
	return &rig{runtime: rt, broker: broker, received: received}
}

// waitMessage reads messages of kind until one decoded into msg satisfies accept.
func waitMessage(t *testing.T, ch <-chan mqtttest.Message, kind lifelinev1.Kind, msg proto.Message, accept func(mqtttest.Message) bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-ch:
			if m.Topic.Kind != kind {
				continue
			}
			if err := proto.Unmarshal(m.Payload, msg); err != nil {
				t.Fatal(err)
			}
			if accept(m) {
				return
			}
		case <-deadline:
			t.Fatalf("no matching %s message within 5s", kind)
		}
	}
}

func waitState(t *testing.T, ch <-chan mqtttest.Message, phase lifelinev1.Phase) *lifelinev1.WorkerState {
	t.Helper()
	ws := &lifelinev1.WorkerState{}
	waitMessage(t, ch, lifelinev1.KindWorkerState, ws, func(m mqtttest.Message) bool {
		if m.Topic.Namespace != ws.Namespace || m.Topic.Pod != ws.Name {
			t.Fatalf("topic %v carries the state of %s/%s", m.Topic, ws.Namespace, ws.Name)
		}
		return ws.Phase == phase
	})
	return ws
}

// [P-WS-1] A container exit reaches the broker within a second, as a retained worker state, through a real CRI
// socket, the journal and an MQTT session.
func TestContainerExitIsPublishedWithinASecond_P_WS_1(t *testing.T) {
	trainer := fakecri.Container{ID: "c1", PodNamespace: "default", PodName: "sdd-trainworker-0", PodUID: "uid-1",
		Name: "train-worker", State: runtimeapi.ContainerState_CONTAINER_RUNNING, StartedAt: time.Now().UnixNano()}
	r := startRig(t, trainer)
	running := waitState(t, r.received, lifelinev1.Phase_PHASE_RUNNING)
	exitedAt := time.Now()
	trainer.State, trainer.ExitCode, trainer.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, 3, time.Now().UnixNano()
	r.runtime.Set(trainer)
	failed := waitState(t, r.received, lifelinev1.Phase_PHASE_FAILED)
	if took := time.Since(exitedAt); took > time.Second {
		t.Errorf("the exit took %v to reach the broker, want under 1s", took)
	}
	if failed.LastExitCode != 3 || failed.Seq <= running.Seq || failed.Name != "sdd-trainworker-0" || failed.Uid != "uid-1" {
		t.Errorf("published state %+v after %+v", failed, running)
	}
}

// [P-CMD-4] A command published by the controller reaches the agent over its session, is executed through the
// runtime, and answered on the results topic.
func TestCommandOverMQTTRestartsTheWorker_P_CMD_4(t *testing.T) {
	r := startRig(t, fakecri.Container{ID: "c1", PodNamespace: "default", PodName: "w", PodUID: "uid-1", Name: "main",
		State: runtimeapi.ContainerState_CONTAINER_RUNNING})
	state := waitState(t, r.received, lifelinev1.Phase_PHASE_RUNNING)

	controller := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + r.broker).SetClientID("lifeline-controller"))
	if tok := controller.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer controller.Disconnect(0)
	cmd, _ := proto.Marshal(&lifelinev1.Command{Id: "restart-1", Namespace: "default", Pod: "w", PodUid: "uid-1",
		Epoch: state.Seq, Action: lifelinev1.Action_ACTION_RESTART, TtlMillis: 60000})
	if tok := controller.Publish(lifelinev1.AgentCommandTopic("c", "edge-1"), 1, false, cmd); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	res := &lifelinev1.CommandResult{}
	waitMessage(t, r.received, lifelinev1.KindResult, res, func(mqtttest.Message) bool { return res.CommandId == "restart-1" })
	if res.Outcome != lifelinev1.Outcome_OUTCOME_DONE {
		t.Fatalf("result %v", res)
	}
	if s := r.runtime.Stopped(); len(s) != 1 || s[0] != "c1" {
		t.Errorf("runtime stopped %v, want the worker's container", s)
	}
}

func TestWorkerState(t *testing.T) {
	t0 := time.Unix(100, 0)
	cases := []struct {
		name  string
		pod   cri.Pod
		phase lifelinev1.Phase
		exit  int32
	}{
		{"running", cri.Pod{Containers: []cri.Container{{Running: true, Attempt: 2}}}, lifelinev1.Phase_PHASE_RUNNING, 0},
		{"failed", cri.Pod{Containers: []cri.Container{{Exited: true, ExitCode: 137, FinishedAt: t0}}}, lifelinev1.Phase_PHASE_FAILED, 137},
		{"succeeded", cri.Pod{Containers: []cri.Container{{Exited: true}}}, lifelinev1.Phase_PHASE_SUCCEEDED, 0},
		{"one of two exited", cri.Pod{Containers: []cri.Container{{Exited: true, ExitCode: 1, FinishedAt: t0}, {Running: true}}}, lifelinev1.Phase_PHASE_RUNNING, 1},
		{"created", cri.Pod{Containers: []cri.Container{{}}}, lifelinev1.Phase_PHASE_PENDING, 0},
	}
	for _, tc := range cases {
		ws := workerState(tc.pod)
		if ws.Phase != tc.phase || ws.LastExitCode != tc.exit {
			t.Errorf("%s: phase %s exit %d, want %s %d", tc.name, ws.Phase, ws.LastExitCode, tc.phase, tc.exit)
		}
	}
	if ws := workerState(cri.Pod{Containers: []cri.Container{{Running: true, Attempt: 2}, {Running: true, Attempt: 1}}}); ws.Restarts != 3 {
		t.Errorf("restarts %d, want the sum of attempts", ws.Restarts)
	}
}

// podsSource is a runtime whose answer the test sets.
type podsSource struct{ pods []cri.Pod }

func (s *podsSource) Pods(context.Context) ([]cri.Pod, error) { return s.pods, nil }

// memCounter numbers from 1, as the journal does.
type memCounter struct{ n uint64 }

func (c *memCounter) NextCounter(string) (uint64, error) { c.n++; return c.n, nil }

// [P-WS-3] A worker's episode is the seq of the state that began it and changes only when the worker goes
// from up to down or back: a stop that re-stamps an exited container's finish time, or a failed worker whose
// pod is then lost, is a new state of the same death, so the controller commands it once. A reconnect
// publishes every state again, in the same episode. A worker found down again with more restarts died again.
func TestEpisodeChangesOnlyWhenAWorkerGoesDownOrUp_P_WS_3(t *testing.T) {
	t0 := time.Unix(100, 0)
	running := cri.Pod{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Running: true}}}
	failed := func(finished time.Time) cri.Pod {
		return cri.Pod{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Exited: true, ExitCode: 137, FinishedAt: finished}}}
	}
	exited0 := cri.Pod{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Exited: true, FinishedAt: t0}}}
	exitedAgain := cri.Pod{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Exited: true, Attempt: 1,
		FinishedAt: t0.Add(time.Minute)}}}
	steps := []struct {
		name        string
		pods        []cri.Pod
		reconnect   bool
		wantEpisode uint64 // the seq of the state that began the episode
	}{
		{"running", []cri.Pod{running}, false, 1},
		{"killed", []cri.Pod{failed(t0)}, false, 2},
		{"a stop re-stamps the exited container", []cri.Pod{failed(t0.Add(time.Second))}, false, 2},
		{"the node lost the pod", nil, false, 2},
		{"rebuilt and running", []cri.Pod{running}, false, 5},
		{"a reconnect publishes it again", []cri.Pod{running}, true, 5},
		{"exited 0", []cri.Pod{exited0}, false, 7},
		{"started again and exited again between two observations", []cri.Pod{exitedAgain}, false, 8},
	}
	src, pub, seq := &podsSource{}, &birthPublisher{birth: 1}, &memCounter{}
	o := &Observer{Cluster: "c", Node: "edge-1", Source: src, Publisher: pub, Seq: seq, Log: logr.Discard()}
	for _, step := range steps {
		src.pods = step.pods
		if step.reconnect {
			pub.birth++
		}
		before := len(pub.entries)
		if err := o.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(pub.entries) != before+1 {
			t.Fatalf("%s: %d states published, want one", step.name, len(pub.entries)-before)
		}
		ws := &lifelinev1.WorkerState{}
		if err := proto.Unmarshal(pub.entries[len(pub.entries)-1].Payload, ws); err != nil {
			t.Fatal(err)
		}
		if ws.Episode != step.wantEpisode {
			t.Errorf("%s: state seq %d (%s) has episode %d, want %d", step.name, ws.Seq, ws.Phase, ws.Episode, step.wantEpisode)
		}
	}
}

// birthPublisher is a publisher whose session the test renews.
type birthPublisher struct {
	memPublisher
	birth uint64
}

func (p *birthPublisher) BirthSeq() uint64 { return p.birth }

// The observer and the command handler remember the workers of the node, not every pod they ever saw: a worker
// whose pod is gone and that is no longer one of the node's workers (its job finished, its pod deleted) is
// forgotten.
func TestObserverForgetsWorkersThatLeftTheNode(t *testing.T) {
	workers := map[string]bool{}
	src, pub, seq := &podsSource{}, &birthPublisher{birth: 1}, &memCounter{}
	cmds := &Commands{Cluster: "c", Node: "edge-1", Actuator: &recordingActuator{}, Publisher: pub}
	o := &Observer{Cluster: "c", Node: "edge-1", Source: src, Publisher: pub, Seq: seq, Log: logr.Discard(),
		IsWorker: func(p cri.Pod) bool { return workers[p.UID] }, OnPublished: cmds.Observed, OnForgotten: cmds.Forget}
	for i := range 100 {
		uid := fmt.Sprintf("uid-%d", i)
		workers[uid] = true
		src.pods = []cri.Pod{{Namespace: "default", Name: fmt.Sprintf("trainer-%d", i), UID: uid,
			Containers: []cri.Container{{Name: "main", Running: true}}}}
		if err := o.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		delete(workers, uid) // the job is done: the pod is deleted
	}
	src.pods = nil
	for range 2 { // gone is published, then forgotten
		if err := o.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(o.last) != 0 || len(o.episodes) != 0 || len(cmds.workers) != 0 {
		t.Errorf("the observer still holds %d states and %d episodes, the command handler %d workers, of pods that left the node",
			len(o.last), len(o.episodes), len(cmds.workers))
	}
	// [P-WS-4] and the broker keeps no retained state of them: each got an empty retained state.
	cleared := map[string]bool{}
	for _, e := range pub.entries {
		if len(e.Payload) == 0 && e.Retained {
			cleared[e.Topic] = true
		}
	}
	if len(cleared) != 100 || !cleared["lifeline/v1/c/nodes/edge-1/workers/default/trainer-42"] {
		t.Errorf("%d retained states cleared, want the 100 workers'", len(cleared))
	}
}

// [P-WS-3] A restarted agent continues the episode of a death it saw before its restart (the journal keeps
// it), so the controller, which commands once per episode, does not command the same death again; a worker
// that came back and died again meanwhile (more restarts) is a new episode.
func TestEpisodeContinuesAcrossAgentRestarts_P_WS_3(t *testing.T) {
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	dead := func(attempt uint32) []cri.Pod {
		return []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Exited: true, ExitCode: 1, Attempt: attempt}}}}
	}
	src := &podsSource{pods: []cri.Pod{{Namespace: "default", Name: "w", UID: "u", Containers: []cri.Container{{Name: "main", Running: true}}}}}
	life := func() (*Observer, *birthPublisher) {
		pub := &birthPublisher{birth: 1}
		return &Observer{Cluster: "c", Node: "edge-1", Source: src, Publisher: pub, Seq: j, Store: j, Log: logr.Discard()}, pub
	}
	latest := func(o *Observer, pub *birthPublisher) *lifelinev1.WorkerState {
		t.Helper()
		if err := o.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		ws := &lifelinev1.WorkerState{}
		if err := proto.Unmarshal(pub.entries[len(pub.entries)-1].Payload, ws); err != nil {
			t.Fatal(err)
		}
		return ws
	}
	o, pub := life()
	latest(o, pub)
	src.pods = dead(0)
	death := latest(o, pub)

	o, pub = life() // the agent restarts; the worker is still dead
	if again := latest(o, pub); again.Episode != death.Episode || again.Seq <= death.Seq {
		t.Errorf("after a restart the dead worker's state %d has episode %d, want the death's %d", again.Seq, again.Episode, death.Episode)
	}
	o, pub = life() // restarts again; meanwhile edged started the worker and it died again
	src.pods = dead(1)
	if next := latest(o, pub); next.Episode == death.Episode || next.Episode != next.Seq {
		t.Errorf("a new death after a restart has episode %d (state %d), want a new one", next.Episode, next.Seq)
	}
}

// [P-HEAL-3] A trainer that completed (exit 0 under OnFailure) and whose containers the node then removed — its
// pod deleted, which the agent may still hold as one of its workers while it thinks the node cut off — is
// finished, not lost: no PHASE_GONE is published for it, so nothing rebuilds it. A JI worker (Always) that
// exited 0 and vanished is lost, and is published GONE.
func TestCompletedWorkerThatVanishesIsNotLost(t *testing.T) {
	src, pub, seq := &podsSource{}, &birthPublisher{birth: 1}, &memCounter{}
	completes := map[string]bool{"u-trainer": true, "u-ji": false}
	o := &Observer{Cluster: "c", Node: "edge-1", Source: src, Publisher: pub, Seq: seq, Log: logr.Discard(),
		IsWorker: func(cri.Pod) bool { return true }, Completes: func(uid string) bool { return completes[uid] }}
	exited := func(name, uid string) cri.Pod {
		return cri.Pod{Namespace: "default", Name: name, UID: uid, Containers: []cri.Container{{Name: "main", Exited: true, ExitCode: 0}}}
	}
	src.pods = []cri.Pod{exited("trainer", "u-trainer"), exited("ji", "u-ji")}
	if err := o.ObserveOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	src.pods = nil
	for range 2 {
		if err := o.ObserveOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	gone := map[string]bool{}
	for _, e := range pub.entries {
		ws := &lifelinev1.WorkerState{}
		if len(e.Payload) > 0 && proto.Unmarshal(e.Payload, ws) == nil && ws.Phase == lifelinev1.Phase_PHASE_GONE {
			gone[ws.Name] = true
		}
	}
	if gone["trainer"] || !gone["ji"] {
		t.Errorf("published GONE for %v, want the JI worker only", gone)
	}
}
