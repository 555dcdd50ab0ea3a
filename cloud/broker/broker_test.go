package broker

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

type rig struct {
	addr    string
	reg     *prometheus.Registry
	tracker *liveness.Tracker
	broker  *Broker

	mu      sync.Mutex
	reached map[string]int // by topic: the messages handed to the controller
}

// startRig runs the embedded broker (TLS when serverTLS is set) for nodes edge1 and edge2, with passwords pw1
// and pw2.
func startRig(t *testing.T, serverTLS *tls.Config) *rig {
	t.Helper()
	return startRigWith(t, serverTLS, Limits{})
}

// startRigWith is startRig with the broker's limits.
func startRigWith(t testing.TB, serverTLS *tls.Config, limits Limits) *rig {
	t.Helper()
	return startBroker(t, serverTLS, limits, map[string]string{"edge1": "pw1", "edge2": "pw2"})
}

// startBroker runs the embedded broker for the nodes of passwords (node name to password).
func startBroker(t testing.TB, serverTLS *tls.Config, limits Limits, passwords map[string]string) *rig {
	t.Helper()
	dir := t.TempDir()
	for node, pw := range passwords {
		if err := os.WriteFile(filepath.Join(dir, node), []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	reg := prometheus.NewRegistry()
	tracker, err := liveness.NewTracker("c", reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{addr: addr, reg: reg, tracker: tracker, reached: map[string]int{}}
	ingest := func(topic string, payload []byte, now time.Time) {
		r.mu.Lock()
		r.reached[topic]++
		r.mu.Unlock()
		tracker.Ingest(topic, payload, now)
	}
	r.broker, err = Start(Config{Address: addr, Cluster: "c", CredentialsDir: dir, Tracker: tracker, Ingest: ingest, TLS: serverTLS, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.broker.Close() })
	return r
}

// connect returns a client connected as user with the agent's client id, or the connection error.
func (r *rig) connect(user, password, will string) (mqtt.Client, error) {
	return r.connectAs(lifelinev1.AgentClientID(user), user, password, will, nil)
}

// connectAs connects with any client id; onLost, when set, is told when the connection is lost.
func (r *rig) connectAs(clientID, user, password, will string, onLost func()) (mqtt.Client, error) {
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + r.addr).SetClientID(clientID).
		SetUsername(user).SetPassword(password).SetAutoReconnect(false).SetProtocolVersion(4)
	if will != "" {
		opts.SetWill(will, "x", 1, true)
	}
	if onLost != nil {
		opts.SetConnectionLostHandler(func(mqtt.Client, error) { onLost() })
	}
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		return nil, tok.Error()
	}
	return c, nil
}

func (r *rig) count(name, label string) float64 {
	families, _ := r.reg.Gather()
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func publish(t testing.TB, c mqtt.Client, qos byte, topic string, m proto.Message) {
	t.Helper()
	payload, _ := proto.Marshal(m)
	c.Publish(topic, qos, false, payload).WaitTimeout(5 * time.Second)
}

// [P-AUTH-1] [P-AUTH-2] [P-BAD-1] A node is admitted by its own password, publishes only its own topics and
// reads only its own commands and desired sets; what is refused is counted and never reaches the table.
func TestBrokerAdmitsNodesAndEnforcesTheACL_P_AUTH_1(t *testing.T) {
	r := startRig(t, nil)
	if _, err := r.connect("edge1", "wrong", ""); err == nil {
		t.Error("a wrong password was admitted")
	}
	if _, err := r.connect("", "", ""); err == nil {
		t.Error("a client without credentials was admitted")
	}
	if _, err := r.connect("edge1", "pw1", "lifeline/v1/c/nodes/edge2/death"); err == nil {
		t.Error("a last will on another node's death was admitted")
	}
	testkit.Until(t, 5*time.Second, "three refused connections counted", func() bool { return r.count("lifeline_liveness_dropped_total", liveness.DropAuth) == 3 })

	edge1, err := r.connect("edge1", "pw1", "lifeline/v1/c/nodes/edge1/death")
	if err != nil {
		t.Fatal(err)
	}
	defer edge1.Disconnect(0)
	publish(t, edge1, 1, "lifeline/v1/c/nodes/edge1/birth", &lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 1})
	publish(t, edge1, 1, "lifeline/v1/c/nodes/edge1/heartbeat", &lifelinev1.Heartbeat{BirthSeq: 1, Seq: 1})
	publish(t, edge1, 1, "lifeline/v1/c/nodes/edge1/workers/default/w1", &lifelinev1.WorkerState{Namespace: "default", Name: "w1", Uid: "u1", Seq: 1, Phase: lifelinev1.Phase_PHASE_RUNNING})
	// edge1 impersonating edge2 and sending a command (QoS 0: a refused QoS 1 publish ends the session, which
	// would stop the test at the first one).
	intruder := edge1
	publish(t, intruder, 0, "lifeline/v1/c/nodes/edge2/birth", &lifelinev1.NodeBirth{Node: "edge2", BirthSeq: 1})
	publish(t, intruder, 0, "lifeline/v1/c/nodes/edge2/workers/default/w2", &lifelinev1.WorkerState{Namespace: "default", Name: "w2", Uid: "u2", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED})
	publish(t, intruder, 0, "lifeline/v1/c/nodes/edge1/commands", &lifelinev1.Command{Id: "x"})
	publish(t, intruder, 0, "lifeline/v1/c/nodes/edge1/desired", &lifelinev1.DesiredWorkers{Node: "edge1"})
	intruder.Subscribe("lifeline/v1/c/nodes/edge2/commands", 1, nil).WaitTimeout(5 * time.Second)
	intruder.Subscribe("lifeline/v1/c/nodes/edge2/desired", 1, nil).WaitTimeout(5 * time.Second)
	testkit.Until(t, 5*time.Second, "six ACL refusals counted", func() bool { return r.count("lifeline_liveness_dropped_total", liveness.DropDenied) == 6 })
	testkit.Until(t, 5*time.Second, "edge1's own messages accepted", func() bool {
		return r.count("lifeline_liveness_messages_total", "birth") == 1 && r.count("lifeline_liveness_messages_total", "workers") == 1
	})
	if r.count("lifeline_liveness_messages_total", "birth") != 1 {
		t.Error("edge2's forged birth reached the table")
	}
	w2 := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w2", UID: "u2"}, Spec: corev1.PodSpec{NodeName: "edge2"}}
	if v := r.tracker.ViewOf(w2, true, time.Now()); v.Truth != liveness.TruthAPIServer {
		t.Errorf("the forged state of edge2's worker changed its view: %+v", v)
	}

	// Commands reach the node they are for, and only that node.
	got := make(chan string, 2)
	edge1.Subscribe("lifeline/v1/c/nodes/edge1/commands", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() }).WaitTimeout(5 * time.Second)
	if err := r.broker.PublishCommand("edge1", []byte("cmd")); err != nil {
		t.Fatal(err)
	}
	select {
	case topic := <-got:
		if topic != "lifeline/v1/c/nodes/edge1/commands" {
			t.Errorf("command arrived on %s", topic)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the command did not reach edge1")
	}

	// So do desired sets [P-DES-1].
	edge1.Subscribe("lifeline/v1/c/nodes/edge1/desired", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() }).WaitTimeout(5 * time.Second)
	if err := r.broker.PublishDesired("edge1", []byte("set")); err != nil {
		t.Fatal(err)
	}
	select {
	case topic := <-got:
		if topic != "lifeline/v1/c/nodes/edge1/desired" {
			t.Errorf("the set arrived on %s", topic)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the set did not reach edge1")
	}
}
