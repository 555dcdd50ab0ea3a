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
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/fakecri"
	"github.com/lifeline-edge/lifeline/test/mqtttest"
)

// [P-WS-1] A container exit reaches the broker within a second, as a retained worker state, through a real CRI
// socket, the journal and an MQTT session.
func TestContainerExitIsPublishedWithinASecond_P_WS_1(t *testing.T) {
	dir := t.TempDir()
	rt, err := fakecri.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	trainer := fakecri.Container{ID: "c1", PodNamespace: "default", PodName: "sdd-trainworker-0", PodUID: "uid-1",
		Name: "train-worker", State: runtimeapi.ContainerState_CONTAINER_RUNNING, StartedAt: time.Now().UnixNano()}
	rt.Set(trainer)

	broker := mqtttest.StartBroker(t)
	received := mqtttest.Subscribe(t, broker, "c", "controller")
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	pub := publisher.New(publisher.Config{Broker: "tcp://" + broker, Cluster: "c", Node: "edge-1", StateDir: dir,
		RetryInterval: 50 * time.Millisecond, Log: logr.Discard()}, j)
	runtime, err := cri.Dial(rt.Socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go pub.Run(ctx)
	obs := &Observer{Cluster: "c", Node: "edge-1", Source: runtime, Publisher: pub, Seq: j,
		Interval: 100 * time.Millisecond, Log: logr.Discard()}
	go obs.Run(ctx)

	running := waitState(t, received, lifelinev1.Phase_PHASE_RUNNING, 5*time.Second)
	exitedAt := time.Now()
	trainer.State, trainer.ExitCode, trainer.FinishedAt = runtimeapi.ContainerState_CONTAINER_EXITED, 3, time.Now().UnixNano()
	rt.Set(trainer)
	failed := waitState(t, received, lifelinev1.Phase_PHASE_FAILED, 5*time.Second)
	if took := time.Since(exitedAt); took > time.Second {
		t.Errorf("the exit took %v to reach the broker, want under 1s", took)
	}
	if failed.LastExitCode != 3 || failed.Seq <= running.Seq || failed.Name != "sdd-trainworker-0" || failed.Uid != "uid-1" {
		t.Errorf("published state %+v after %+v", failed, running)
	}
}

func waitState(t *testing.T, ch <-chan mqtttest.Message, phase lifelinev1.Phase, timeout time.Duration) *lifelinev1.WorkerState {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-ch:
			if m.Topic.Kind != lifelinev1.KindWorkerState {
				continue
			}
			ws := &lifelinev1.WorkerState{}
			if err := proto.Unmarshal(m.Payload, ws); err != nil {
				t.Fatal(err)
			}
			if m.Topic.Namespace != ws.Namespace || m.Topic.Pod != ws.Name {
				t.Fatalf("topic %v carries the state of %s/%s", m.Topic, ws.Namespace, ws.Name)
			}
			if ws.Phase == phase {
				return ws
			}
		case <-deadline:
			t.Fatalf("no %s state within %v", phase, timeout)
		}
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

// [P-CMD-4] A command published by the controller reaches the agent over its session, is executed through the
// runtime, and answered on the results topic.
func TestCommandOverMQTTRestartsTheWorker_P_CMD_4(t *testing.T) {
	dir := t.TempDir()
	rt, err := fakecri.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	rt.Set(fakecri.Container{ID: "c1", PodNamespace: "default", PodName: "w", PodUID: "uid-1", Name: "main",
		State: runtimeapi.ContainerState_CONTAINER_RUNNING})
	runtime, err := cri.Dial(rt.Socket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close()
	broker := mqtttest.StartBroker(t)
	received := mqtttest.Subscribe(t, broker, "c", "controller")
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pub *publisher.Publisher
	cmds := &Commands{Cluster: "c", Node: "edge-1", Actuator: &CRIActuator{Runtime: runtime, Grace: time.Second}}
	pub = publisher.New(publisher.Config{Broker: "tcp://" + broker, Cluster: "c", Node: "edge-1", StateDir: dir,
		RetryInterval: 50 * time.Millisecond, Log: logr.Discard(),
		OnCommand: func(payload []byte) { _ = cmds.Handle(ctx, payload) }}, j)
	cmds.Publisher = pub
	go pub.Run(ctx)
	obs := &Observer{Cluster: "c", Node: "edge-1", Source: runtime, Publisher: pub, Seq: j, Interval: 50 * time.Millisecond,
		Log: logr.Discard(), OnPublished: cmds.Observed}
	go obs.Run(ctx)
	state := waitState(t, received, lifelinev1.Phase_PHASE_RUNNING, 5*time.Second)

	controller := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + broker).SetClientID("lifeline-controller"))
	if tok := controller.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer controller.Disconnect(0)
	cmd, _ := proto.Marshal(&lifelinev1.Command{Id: "restart-1", Namespace: "default", Pod: "w", PodUid: "uid-1",
		Epoch: state.Seq, Action: lifelinev1.Action_ACTION_RESTART, ExpiresUnixNano: time.Now().Add(time.Minute).UnixNano()})
	if tok := controller.Publish(lifelinev1.AgentCommandTopic("c", "edge-1"), 1, false, cmd); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-received:
			if m.Topic.Kind != lifelinev1.KindResult {
				continue
			}
			res := &lifelinev1.CommandResult{}
			if err := proto.Unmarshal(m.Payload, res); err != nil {
				t.Fatal(err)
			}
			if res.CommandId != "restart-1" || res.Outcome != lifelinev1.Outcome_OUTCOME_DONE {
				t.Fatalf("result %v", res)
			}
			if s := rt.Stopped(); len(s) != 1 || s[0] != "c1" {
				t.Errorf("runtime stopped %v, want the worker's container", s)
			}
			return
		case <-deadline:
			t.Fatal("no command result within 5s")
		}
	}
}
