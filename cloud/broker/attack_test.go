package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/reportapi"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

const dropped = "lifeline_liveness_dropped_total"

// delivered counts, by topic, the messages the broker handed to the controller.
func (r *rig) delivered(t testing.TB) func(topic string) int {
	t.Helper()
	return func(topic string) int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.reached[topic]
	}
}

// retained reports whether the broker holds a retained message on topic.
func (r *rig) retained(topic string) bool {
	_, ok := r.broker.server.Topics.Retained.Get(topic)
	return ok
}

// closedByServer waits until the server closes conn, reading (and discarding) what it sends.
func closedByServer(t testing.TB, conn net.Conn, within time.Duration) bool {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// connectHeader is the fixed header of a CONNECT that announces remaining bytes.
func connectHeader(remaining int) []byte {
	h := []byte{0x10}
	for {
		b := byte(remaining % 128)
		remaining /= 128
		if remaining > 0 {
			b |= 0x80
		}
		h = append(h, b)
		if remaining == 0 {
			return h
		}
	}
}

// An unauthenticated CONNECT announcing 48 MiB, which mochi without a maximum packet size allocates twice before
// reading it: the broker closes the connection on reading the header, allocates (almost) nothing, and counts it.
func TestOversizedConnectIsRefusedBeforeItIsRead(t *testing.T) {
	r := startRig(t, nil)
	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := conn.Write(append(connectHeader(48<<20), make([]byte, 64<<10)...)); err != nil {
		t.Fatal(err)
	}
	if !closedByServer(t, conn, 5*time.Second) {
		t.Fatal("the broker kept reading an oversized CONNECT")
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Errorf("the process allocated %d MiB for an oversized CONNECT", grew>>20)
	}
	testkit.Until(t, 5*time.Second, "the oversized packet counted", func() bool { return r.count(dropped, RefusedTooLarge) == 1 })
}

// A connection that never completes its CONNECT (silent, or trickling a partial one) would hold its memory
// before authentication for good: it is closed at the CONNECT deadline and counted; a connection that completed
// its CONNECT is not.
func TestConnectionWithoutConnectIsClosedAtTheDeadline(t *testing.T) {
	r := startRigWith(t, nil, Limits{ConnectTimeout: 300 * time.Millisecond})
	for i, first := range [][]byte{nil, connectHeader(40)[:1], append(connectHeader(40), 0, 4, 'M', 'Q')} {
		conn, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write(first); err != nil {
			t.Fatal(err)
		}
		if !closedByServer(t, conn, 5*time.Second) {
			t.Fatalf("connection %d without a CONNECT is still open", i)
		}
	}
	testkit.Until(t, 5*time.Second, "three timeouts counted", func() bool { return r.count(dropped, RefusedConnectTimeout) == 3 })

	agent, err := r.connect("edge1", "pw1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Disconnect(0)
	// The broker's own deadline tells the time: two silent connections, each opened once the one before was
	// closed at its deadline, the first after the agent's CONNECT. The agent's connection outlived its deadline
	// twice over.
	for range 2 {
		silent, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer silent.Close()
		if !closedByServer(t, silent, 5*time.Second) {
			t.Fatal("a connection without a CONNECT is still open")
		}
	}
	testkit.Until(t, 5*time.Second, "the silent connections' timeouts counted", func() bool { return r.count(dropped, RefusedConnectTimeout) >= 5 })
	if !agent.IsConnectionOpen() || r.count(dropped, RefusedConnectTimeout) != 5 {
		t.Error("an authenticated session was closed at the CONNECT deadline")
	}
}

// A node connecting with another node's client id would take that node's session over and fire its last will:
// its death, retained. [P-AUTH-4] The id is bound to the user: the intruder is refused and counted, the victim
// stays connected, and no death is published or retained.
func TestAnotherNodesClientIDIsRefusedAndTheVictimStaysConnected_P_AUTH_4(t *testing.T) {
	r := startRig(t, nil)
	delivered := r.delivered(t)
	deathTopic := lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindDeath).String()
	var lost atomic.Bool
	victim, err := r.connectAs(lifelinev1.AgentClientID("edge1"), "edge1", "pw1", deathTopic, func() { lost.Store(true) })
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Disconnect(0)
	for _, id := range []string{lifelinev1.AgentClientID("edge1"), "anything-else"} {
		if _, err := r.connectAs(id, "edge2", "pw2", "", nil); err == nil {
			t.Errorf("edge2 was admitted with client id %q", id)
		}
	}
	testkit.Until(t, 5*time.Second, "two refusals counted", func() bool { return r.count(dropped, RefusedClientID) == 2 })
	hb := lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindHeartbeat).String()
	publish(t, victim, 1, hb, &lifelinev1.Heartbeat{BirthSeq: 1, Seq: 1})
	testkit.Until(t, 5*time.Second, "the victim's heartbeat delivered", func() bool { return delivered(hb) == 1 })
	if lost.Load() || !victim.IsConnectionOpen() {
		t.Error("the victim lost its session")
	}
	if delivered(deathTopic) != 0 || r.retained(deathTopic) {
		t.Error("the victim's death was published")
	}
}

// A node's reconnect (same id, same password) takes its old session over: how an agent recovers from a
// half-open connection.
func TestOwnReconnectTakesOverTheOldSession(t *testing.T) {
	r := startRig(t, nil)
	lost := make(chan struct{})
	old, err := r.connectAs(lifelinev1.AgentClientID("edge1"), "edge1", "pw1", "", func() { close(lost) })
	if err != nil {
		t.Fatal(err)
	}
	defer old.Disconnect(0)
	fresh, err := r.connect("edge1", "pw1", "")
	if err != nil {
		t.Fatalf("the node's reconnect was refused: %v", err)
	}
	defer fresh.Disconnect(0)
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the old session was not taken over")
	}
	if !fresh.IsConnectionOpen() || r.count(dropped, RefusedClientID) != 0 {
		t.Error("the reconnect did not keep the session")
	}
}

// [P-RETAIN-2] The embedded broker retains nothing, not even what the protocol has agents retain: every message,
// the last will too, reaches the controller and the broker keeps none of it. A retain flag where the protocol
// never retains is counted [P-RETAIN-1].
func TestEmbeddedBrokerRetainsNothing_P_RETAIN_2(t *testing.T) {
	r := startRig(t, nil)
	delivered := r.delivered(t)
	edge1, err := r.connect("edge1", "pw1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer edge1.Disconnect(0)
	var published []string
	for _, kind := range []lifelinev1.Kind{lifelinev1.KindHeartbeat, lifelinev1.KindReport, lifelinev1.KindResult,
		lifelinev1.KindBirth, lifelinev1.KindWorkerState} {
		topic := lifelinev1.NodeTopic("c", "edge1", kind).String()
		if kind == lifelinev1.KindWorkerState {
			topic = lifelinev1.WorkerTopic("c", "edge1", "default", "w").String()
		}
		edge1.Publish(topic, 1, true, []byte{0x08, 0x01}).WaitTimeout(5 * time.Second)
		testkit.Until(t, 5*time.Second, topic+" delivered", func() bool { return delivered(topic) == 1 })
		published = append(published, topic)
	}
	if n := r.count(dropped, RefusedRetain); n != 3 {
		t.Errorf("%v retain flags counted, want 3", n)
	}

	death := lifelinev1.NodeTopic("c", "edge2", lifelinev1.KindDeath).String()
	if _, err := r.connect("edge2", "pw2", death); err != nil { // its will is retained
		t.Fatal(err)
	}
	if !r.broker.CloseNode("edge2") {
		t.Fatal("edge2 had no session to end")
	}
	testkit.Until(t, 5*time.Second, "edge2's will delivered", func() bool { return delivered(death) == 1 })
	for _, topic := range append(published, death) {
		if r.retained(topic) {
			t.Errorf("%s retained", topic)
		}
	}
}

// A payload over its kind's cap is acknowledged and discarded (never delivered nor retained) and counted, and
// the session goes on; the largest legal report (64 KiB of body, as the agent's report API takes) passes.
func TestOversizedPublishIsRefused_P_RETAIN_1(t *testing.T) {
	r := startRig(t, nil)
	delivered := r.delivered(t)
	edge1, err := r.connect("edge1", "pw1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer edge1.Disconnect(0)
	worker := lifelinev1.WorkerTopic("c", "edge1", "default", "w").String()
	hb := lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindHeartbeat).String()
	edge1.Publish(worker, 1, true, make([]byte, maxPayload[lifelinev1.KindWorkerState]+1)).WaitTimeout(5 * time.Second)
	edge1.Publish(hb, 1, false, make([]byte, 300)).WaitTimeout(5 * time.Second)
	testkit.Until(t, 5*time.Second, "two oversized payloads counted", func() bool { return r.count(dropped, RefusedTooLarge) == 2 })

	body, err := json.Marshal(map[string]string{"name": "w", "namespace": "default", "ownerKind": "jointinferenceservice", "ownerName": "ji"})
	if err != nil {
		t.Fatal(err)
	}
	body = append(body[:len(body)-1], []byte(`,"pad":"`+strings.Repeat("x", reportapi.MaxBodyBytes-len(body)-9)+`"}`)...)
	if len(body) != reportapi.MaxBodyBytes || !json.Valid(body) {
		t.Fatalf("report body of %d bytes", len(body))
	}
	report, _ := proto.Marshal(&lifelinev1.WorkerReport{Namespace: "default", Worker: "w", Body: body, Seq: 1,
		ReceivedUnixNano: time.Now().UnixNano(), BirthSeq: 1 << 60})
	reports := lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindReport).String()
	edge1.Publish(reports, 1, false, report).WaitTimeout(5 * time.Second)
	testkit.Until(t, 5*time.Second, "the largest legal report delivered", func() bool { return delivered(reports) == 1 })
	if delivered(worker) != 0 || r.retained(worker) || delivered(hb) != 0 || !edge1.IsConnectionOpen() {
		t.Error("an oversized payload was delivered or retained, or ended the session")
	}
	if r.count(dropped, RefusedTooLarge) != 2 {
		t.Error("the largest legal report was counted as too large")
	}
}

// Every reason to refuse or count a publish, decided without a broker.
func TestPublishVerdict(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kind        lifelinev1.Kind
		size        int
		retain      bool
		wantDeliver bool
		wantReason  string
	}{
		{"heartbeat", lifelinev1.KindHeartbeat, 30, false, true, ""},
		{"retained heartbeat", lifelinev1.KindHeartbeat, 30, true, true, RefusedRetain},
		{"retained report", lifelinev1.KindReport, 30, true, true, RefusedRetain},
		{"retained result", lifelinev1.KindResult, 30, true, true, RefusedRetain},
		{"birth", lifelinev1.KindBirth, 60, true, true, ""},
		{"death", lifelinev1.KindDeath, 20, true, true, ""},
		{"worker", lifelinev1.KindWorkerState, 130, true, true, ""},
		{"clearing a worker", lifelinev1.KindWorkerState, 0, true, true, ""},
		{"oversized worker", lifelinev1.KindWorkerState, 4<<10 + 1, true, false, RefusedTooLarge},
		{"oversized birth", lifelinev1.KindBirth, 1<<10 + 1, true, false, RefusedTooLarge},
		{"oversized heartbeat", lifelinev1.KindHeartbeat, 257, false, false, RefusedTooLarge},
		{"largest report", lifelinev1.KindReport, maxReportBody + 1<<10, false, true, ""},
		{"oversized report", lifelinev1.KindReport, maxReportBody + 1<<10 + 1, false, false, RefusedTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deliver, reason := publishVerdict(tc.kind, tc.size, tc.retain)
			if deliver != tc.wantDeliver || reason != tc.wantReason {
				t.Errorf("got %t %q, want %t %q", deliver, reason, tc.wantDeliver, tc.wantReason)
			}
		})
	}
}

// How a connection ended decides what is counted.
func TestRefusalOf(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		sawConnect bool
		want       string
	}{
		{"clean end", nil, true, ""},
		{"client hung up", io.EOF, false, ""},
		{"broker closing", net.ErrClosed, false, ""},
		{"oversized first packet", fmt.Errorf("read connection: %w", packets.ErrPacketTooLarge), false, RefusedTooLarge},
		{"oversized later packet", packets.ErrPacketTooLarge, true, RefusedTooLarge},
		{"no CONNECT in time", fmt.Errorf("read connection: %w", os.ErrDeadlineExceeded), false, RefusedConnectTimeout},
		{"keepalive expired", os.ErrDeadlineExceeded, true, ""},
		{"garbage first", fmt.Errorf("read connection: %w", packets.ErrProtocolViolationRequireFirstConnect), false, RefusedMalformed},
		{"bad credentials", packets.ErrBadUsernameOrPassword, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusalOf(tc.err, tc.sawConnect); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// rawSession is an MQTT 3.1.1 session by hand, for clients that misbehave: it connects as the agent of node,
// subscribes to the node's commands at QoS 1 and reads both acknowledgements; what it reads afterwards is up
// to the caller.
func rawSession(t testing.TB, addr, node, password string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var buf bytes.Buffer
	connect := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60,
			ClientIdentifier: lifelinev1.AgentClientID(node), UsernameFlag: true, Username: []byte(node),
			PasswordFlag: true, Password: []byte(password)}}
	subscribe := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 4,
		PacketID: 1, Filters: packets.Subscriptions{{Filter: lifelinev1.AgentCommandTopic("c", node), Qos: 1}}}
	if err := connect.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if err := subscribe.SubscribeEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	// CONNACK (4 bytes) and SUBACK (5 bytes).
	ack := make([]byte, 9)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, ack); err != nil || ack[0] != 0x20 || ack[3] != 0 || ack[4] != 0x90 || ack[8] != 1 {
		t.Fatalf("session of %s: acknowledgements % x, %v", node, ack, err)
	}
	return conn
}

// An agent that stops acknowledging its commands could make the broker keep every further one. The broker
// keeps a bounded number, and a command past it fails at once with a clear error, counted, instead of being
// dropped without a word; the heap stays bounded.
func TestCommandsToAnAgentThatDoesNotAcknowledgeAreBounded(t *testing.T) {
	r := startRig(t, nil)
	rawSession(t, r.addr, "edge1", "pw1")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	command := make([]byte, 16<<10)
	sent, refused := 0, 0
	for range 1000 {
		if err := r.broker.PublishCommand("edge1", command); err != nil {
			refused++
		} else {
			sent++
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if max := int(capabilities().MaximumInflight); sent != max || refused != 1000-max {
		t.Errorf("%d commands taken and %d refused, want %d and %d", sent, refused, max, 1000-max)
	}
	if n := r.count(dropped, RefusedSlowClient); n != float64(refused) {
		t.Errorf("%v refusals counted, want %d", n, refused)
	}
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 8<<20 {
		t.Errorf("the heap grew by %d MiB for 16 MiB of commands to a stuck agent", grew>>20)
	}
}

// A last will is the node's death, held for as long as its session lives: one over the death's maximum payload
// is refused at CONNECT, and counted.
func TestOversizedLastWillIsRefused(t *testing.T) {
	r := startRig(t, nil)
	deathTopic := lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindDeath).String()
	for _, tc := range []struct {
		size  int
		admit bool
	}{{maxPayload[lifelinev1.KindDeath], true}, {maxPayload[lifelinev1.KindDeath] + 1, false}} {
		opts := mqtt.NewClientOptions().AddBroker("tcp://"+r.addr).SetClientID(lifelinev1.AgentClientID("edge1")).
			SetUsername("edge1").SetPassword("pw1").SetAutoReconnect(false).SetProtocolVersion(4).
			SetBinaryWill(deathTopic, make([]byte, tc.size), 1, true)
		c := mqtt.NewClient(opts)
		tok := c.Connect()
		admitted := tok.WaitTimeout(5*time.Second) && tok.Error() == nil
		if admitted != tc.admit {
			t.Errorf("a will of %d bytes: admitted %t, want %t", tc.size, admitted, tc.admit)
		}
		c.Disconnect(0)
	}
	if n := r.count(dropped, RefusedTooLarge); n != 1 {
		t.Errorf("%v oversized wills counted, want 1", n)
	}
}
