package agent

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/edge/restart"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// rig is an agent assembled as cmd/lifeline-agent assembles it — CRI runtime, journal, MQTT session and the
// agent's loop — against a fake runtime on a real unix socket and an embedded broker.
type rig struct {
	runtime  *simnode.CRI
	broker   string
	received <-chan testkit.Message
}

func startRig(t *testing.T, containers ...simnode.CRIContainer) *rig {
	t.Helper()
	dir := t.TempDir()
	rt, err := simnode.StartCRI(dir)
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
	broker := testkit.StartBroker(t)
	received := testkit.Subscribe(t, broker, "c", "controller")
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var workers fixedWorkers
	for _, c := range containers {
		workers = append(workers, desired.Worker{Namespace: c.PodNamespace, Name: c.PodName, UID: c.PodUID})
	}
	var a *Agent
	pub := publisher.New(publisher.Config{Broker: "tcp://" + broker, Cluster: "c", Node: "edge-1", StateDir: dir,
		RetryInterval: 50 * time.Millisecond, Log: logr.Discard(), OnCommand: func(payload []byte) { a.HandleCommand(payload) }}, j)
	a, err = New(Config{Cluster: "c", Node: "edge-1", Source: runtime, Workers: workers, Publisher: pub, Store: j,
		Actuator: &restart.CRIActuator{Runtime: runtime, Grace: time.Second}, APIReachable: func() bool { return true }, BrokerUp: pub.Connected,
		Interval: 100 * time.Millisecond, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Background(t, ctx, pub.Run)
	testkit.Background(t, ctx, a.Run)
	return &rig{runtime: rt, broker: broker, received: received}
}

// waitMessage reads messages of kind until one decoded into msg satisfies accept.
func waitMessage(t *testing.T, ch <-chan testkit.Message, kind lifelinev1.Kind, msg proto.Message, accept func(testkit.Message) bool) {
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

func waitState(t *testing.T, ch <-chan testkit.Message, phase lifelinev1.Phase) *lifelinev1.WorkerState {
	t.Helper()
	ws := &lifelinev1.WorkerState{}
	waitMessage(t, ch, lifelinev1.KindWorkerState, ws, func(m testkit.Message) bool {
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
	trainer := simnode.CRIContainer{ID: "c1", PodNamespace: "default", PodName: "sdd-trainworker-0", PodUID: "uid-1",
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
	r := startRig(t, simnode.CRIContainer{ID: "c1", PodNamespace: "default", PodName: "w", PodUID: "uid-1", Name: "main",
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
	waitMessage(t, r.received, lifelinev1.KindResult, res, func(testkit.Message) bool { return res.CommandId == "restart-1" })
	if res.Outcome != lifelinev1.Outcome_OUTCOME_DONE {
		t.Fatalf("result %v", res)
	}
	if s := r.runtime.Stopped(); len(s) != 1 || s[0] != "c1" {
		t.Errorf("runtime stopped %v, want the worker's container", s)
	}
}
