package broker

import (
	"net"
	"net/netip"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// dialFrom dials addr from the loopback address source ("" for the default), closing the connection at the
// test's end.
func dialFrom(t *testing.T, addr, source string) net.Conn {
	t.Helper()
	d := net.Dialer{}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// floodIdle opens n connections to addr from source that never send a CONNECT; with hello, each starts a TLS
// handshake that it never finishes.
func floodIdle(t *testing.T, addr, source string, n int, hello []byte) {
	t.Helper()
	for range n {
		if _, err := dialFrom(t, addr, source).Write(hello); err != nil {
			t.Fatal(err)
		}
	}
}

// tlsHelloHeader is the header of a TLS handshake record of 512 bytes, the start of a ClientHello.
var tlsHelloHeader = []byte{0x16, 0x03, 0x01, 0x02, 0x00}

// loopback is the source of the tests' connections by default.
var loopback = netip.MustParsePrefix("127.0.0.1/32")

// 300 connections that never authenticate (idle, or stalled in their TLS handshake), from the agents' own
// address and far more than the sessions' limit, held while agents log in. They used to take the slots of
// authenticated sessions, and a reconnecting agent was refused until they timed out; now they have a budget of
// their own, in which the oldest makes room for the newest, and the agent, which completes its CONNECT at once,
// gets in by password and by certificate.
func TestPreAuthFloodLeavesRoomForAgents(t *testing.T) {
	const flood = 300
	perSource := DefaultLimits().MaxUnauthenticatedPerSource
	held := func(t *testing.T, r *rig) {
		t.Helper()
		testkit.Until(t, 5*time.Second, "the flood accepted, its oldest evicted", func() bool {
			return r.broker.listener.open() == perSource && r.count(dropped, RefusedPreAuthEvicted) == float64(flood-perSource)
		})
	}
	t.Run("password", func(t *testing.T) {
		r := startRigWith(t, nil, Limits{MaxConnections: 50})
		floodIdle(t, r.addr, "", flood, nil)
		held(t, r)
		agent, err := r.connect("edge1", "pw1", "")
		if err != nil {
			t.Fatalf("an agent could not log in by password during the flood: %v", err)
		}
		defer agent.Disconnect(0)
		if _, ofSource := r.broker.listener.unauthenticated(loopback); ofSource != perSource-1 {
			t.Errorf("%d connections of the flood held beside the agent, want %d", ofSource, perSource-1)
		}
	})
	t.Run("certificate", func(t *testing.T) {
		r := startCertRigWith(t, nil, Limits{MaxConnections: 50})
		floodIdle(t, r.addr, "", flood, tlsHelloHeader)
		held(t, r.rig)
		cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
		agent, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, nil)
		if err != nil {
			t.Fatalf("an agent could not log in by certificate during the flood: %v", err)
		}
		defer agent.Disconnect(0)
		other, err := r.login(lifelinev1.AgentClientID("edge2"), "edge2", "pw2", nil, nil)
		if err != nil {
			t.Fatalf("an agent could not log in by password over TLS during the flood: %v", err)
		}
		defer other.Disconnect(0)
		// The first agent's connection took the place of the flood's oldest, and left the budget as it
		// authenticated; the second found that room.
		if _, ofSource := r.broker.listener.unauthenticated(loopback); ofSource != perSource-1 {
			t.Errorf("%d connections of the flood held beside the agents, want %d", ofSource, perSource-1)
		}
	})
}

// A flood from many connections of one source that fills the whole budget of unauthenticated connections
// closes only its own: another source's connection still in its handshake stays, and an agent arriving from a
// third source gets in.
func TestPreAuthFloodFromOneSourceEvictsOnlyItsOwn(t *testing.T) {
	r := startRigWith(t, nil, Limits{MaxUnauthenticated: 16, MaxUnauthenticatedPerSource: 64})
	dialFrom(t, r.addr, "127.0.0.2")
	floodIdle(t, r.addr, "127.0.0.1", 100, nil)
	testkit.Until(t, 5*time.Second, "the flood evicting its own", func() bool { return r.count(dropped, RefusedPreAuthEvicted) == 101-16 })
	if all, ofSource := r.broker.listener.unauthenticated(netip.MustParsePrefix("127.0.0.2/32")); all != 16 || ofSource != 1 {
		t.Fatalf("%d unauthenticated connections, %d of the other source; want 16 and 1", all, ofSource)
	}
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + r.addr).SetClientID(lifelinev1.AgentClientID("edge1")).
		SetUsername("edge1").SetPassword("pw1").SetAutoReconnect(false).SetProtocolVersion(4).
		SetDialer(&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 5 * time.Second})
	agent := mqtt.NewClient(opts)
	if tok := agent.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("an agent from another source could not log in during the flood: %v", tok.Error())
	}
	defer agent.Disconnect(0)
	if _, ofSource := r.broker.listener.unauthenticated(netip.MustParsePrefix("127.0.0.2/32")); ofSource != 1 {
		t.Error("the flood closed another source's connection")
	}
}

// A client that starts a TLS handshake and stalls holds its connection only until the handshake's deadline,
// well before the CONNECT's, and is counted.
func TestStalledTLSHandshakeIsClosedAtItsDeadline(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{HandshakeTimeout: 200 * time.Millisecond, ConnectTimeout: time.Hour})
	conn := dialFrom(t, r.addr, "")
	if _, err := conn.Write(tlsHelloHeader); err != nil {
		t.Fatal(err)
	}
	if !closedByServer(t, conn, 5*time.Second) {
		t.Fatal("a stalled TLS handshake is still open")
	}
	testkit.Until(t, 5*time.Second, "the timeout counted", func() bool { return r.count(dropped, RefusedConnectTimeout) == 1 })
	cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	agent, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, nil)
	if err != nil {
		t.Fatalf("a prompt handshake: %v", err)
	}
	agent.Disconnect(0)
}

// The sessions' limit is the authenticated sessions', apart from connections still logging in: good credentials
// beyond it are refused and counted, a node's reconnect at the limit takes its old session over, and a slot
// freed is usable again.
func TestSessionLimitRefusesTheOneTooMany(t *testing.T) {
	r := startBroker(t, nil, Limits{MaxConnections: 2}, map[string]string{"edge1": "pw1", "edge2": "pw2", "edge3": "pw3"})
	dialFrom(t, r.addr, "") // not yet authenticated: not a session
	edge1, err := r.connect("edge1", "pw1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer edge1.Disconnect(0)
	edge2, err := r.connect("edge2", "pw2", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.connect("edge3", "pw3", ""); err == nil {
		t.Error("a third session was admitted")
	}
	testkit.Until(t, 5*time.Second, "the refusal counted", func() bool { return r.count(dropped, RefusedConnections) == 1 })
	sessions := SessionMetrics(func() *Broker { return r.broker })
	if got := scrapeGauges(t, sessions); got["lifeline_broker_sessions"] != 2 || got["lifeline_broker_max_sessions"] != 2 {
		t.Errorf("scraped %v, want 2 sessions open of 2", got)
	}
	if got := scrapeGauges(t, SessionMetrics(func() *Broker { return nil })); len(got) != 0 {
		t.Errorf("a controller with no broker running scraped %v, want nothing", got)
	}
	again, err := r.connect("edge1", "pw1", "")
	if err != nil {
		t.Fatalf("a node's reconnect at the limit: %v", err)
	}
	defer again.Disconnect(0)
	edge2.Disconnect(0)
	testkit.Until(t, 5*time.Second, "edge2's slot freed", func() bool { return r.broker.listener.open() == 2 })
	edge3, err := r.connect("edge3", "pw3", "")
	if err != nil {
		t.Fatalf("an agent could not use a freed slot: %v", err)
	}
	edge3.Disconnect(0)
}

// scrapeGauges gathers c's gauges by name.
func scrapeGauges(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
	}
	return got
}
