package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sync"
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
	// The limit counts sessions: the connection that never spoke may not even be accepted yet (TCP_DEFER_ACCEPT),
	// and edge1's first session may still be closing after its reconnect took it over.
	testkit.Until(t, 5*time.Second, "edge2's slot freed", func() bool { open, _ := r.broker.Sessions(); return open == 1 })
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

// churnLogin is what agents logging in during a churn of connections that never log in saw.
type churnLogin struct {
	loggedIn   int             // agents in within their connect timeout
	took       []time.Duration // each agent's login, dial to CONNACK, of those in
	churnPerS  float64         // the churn's new connections a second
	roundTrips []time.Duration // the agents' round trips
}

// loginUnderChurn churns connections that start a TLS handshake and never finish it from 127.0.0.1, as fast as
// one dialer can, while len(sources) agents log in by certificate, agent i from sources[i] with a round trip of
// 50 to 300 ms (added to each of its writes: a login is a few request-answer flights); each has 10 s. With
// resume, each agent logged in once before the churn, and resumes that TLS session, as the agent does.
func loginUnderChurn(tb testing.TB, r *certRig, sources []string, resume bool) churnLogin {
	tb.Helper()
	certs, caches := make([]tls.Certificate, len(sources)), make([]tls.ClientSessionCache, len(sources))
	for i, source := range sources {
		certs[i] = r.ca.Issue(tb, nodeCert(r.ca, fmt.Sprintf("edge%d", i+1)))
		if !resume {
			continue
		}
		caches[i] = tls.NewLRUClientSessionCache(1)
		c, err := r.loginOver(lifelinev1.AgentClientID(fmt.Sprintf("edge%d", i+1)), &certs[i], caches[i], source, 0, 0)
		if err != nil {
			tb.Fatalf("agent %d's first login, before the churn: %v", i+1, err)
		}
		c.Disconnect(0)
	}
	stop, churned := make(chan struct{}), make(chan int)
	go func() {
		var open []net.Conn
		n := 0
		defer func() {
			for _, c := range open {
				c.Close()
			}
			churned <- n
		}()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := net.Dial("tcp", r.addr)
			if err != nil {
				continue
			}
			_, _ = c.Write(tlsHelloHeader)
			n++
			if open = append(open, c); len(open) > 64 { // the broker evicted these long ago
				open[0].Close()
				open = open[1:]
			}
		}
	}()
	time.Sleep(200 * time.Millisecond) // the churn under way
	began := time.Now()
	out := churnLogin{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, source := range sources {
		rtt := 50*time.Millisecond + time.Duration(i)*250*time.Millisecond/time.Duration(max(len(sources)-1, 1))
		out.roundTrips = append(out.roundTrips, rtt)
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			c, err := r.loginOver(lifelinev1.AgentClientID(fmt.Sprintf("edge%d", i+1)), &certs[i], caches[i], source, rtt, helloBuildTime)
			if err != nil {
				tb.Logf("agent %d (%s, round trip %v): %v", i+1, source, rtt, err)
				return
			}
			defer c.Disconnect(0)
			mu.Lock()
			out.loggedIn++
			out.took = append(out.took, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stop)
	out.churnPerS = float64(<-churned) / time.Since(began).Seconds()
	slices.Sort(out.took)
	return out
}

// loginOver logs in by certificate from source with rtt added to each write but the first, which goes helloAfter
// after the connection opened, over TLS, resuming a session of cache when it holds one (nil: none); 10 s for the
// whole login.
func (r *certRig) loginOver(clientID string, cert *tls.Certificate, cache tls.ClientSessionCache, source string, rtt, helloAfter time.Duration) (mqtt.Client, error) {
	cfg := &tls.Config{RootCAs: r.roots, MinVersion: tls.VersionTLS12, ClientSessionCache: cache,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }}
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + r.addr).SetClientID(clientID).SetAutoReconnect(false).
		SetProtocolVersion(4).SetConnectTimeout(10 * time.Second).
		SetCustomOpenConnectionFn(func(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 10 * time.Second}
			conn, err := d.Dial("tcp", uri.Host)
			if err != nil {
				return nil, err
			}
			named := cfg.Clone()
			named.ServerName = uri.Hostname()
			tlsConn := tls.Client(&slowConn{Conn: conn, delay: rtt, first: helloAfter}, named)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tlsConn.HandshakeContext(ctx); err != nil {
				conn.Close()
				return nil, err
			}
			return tlsConn, nil
		})
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connecting: %v", tok.Error())
	}
	return c, nil
}

// slowConn delays each write but the first by delay, a round trip the far end sees on every flight, and the first
// by first.
type slowConn struct {
	net.Conn
	delay, first time.Duration
	wrote        bool
}

// Write sends p a round trip after the client's last write (the far end's answer to it on the way), but the
// first, which the client's kernel sends right behind the ACK that completed the connection, once the client
// built it.
func (c *slowConn) Write(p []byte) (int, error) {
	wait := c.first
	if c.wrote {
		wait = c.delay
	}
	time.Sleep(wait)
	c.wrote = true
	return c.Conn.Write(p)
}

// helloBuildTime is how long after its connection opened an agent under the churn sends its ClientHello: an agent
// makes its key shares (an ML-KEM one among them) once its connect returned, which takes a small or loaded node
// milliseconds, while its kernel acknowledged the connection at once.
const helloBuildTime = 20 * time.Millisecond

// [T] item 3: six agents at round trips of 50 to 300 ms all log in through a churn of thousands of connections a
// second that never finish their handshake: from addresses of their own (the broker Service's
// externalTrafficPolicy Local), since the broker bounds the connections not yet logged in per source address (32);
// and from the churn's own address (the chart's NodePort Service as shipped, Cluster: every agent behind one
// node's address) when they logged in before, resuming their TLS sessions, vouched for by their tickets. The
// anchor, the same agents from that address without a session to resume, does not (BenchmarkLoginThroughAChurn).
func TestAgentsLogInThroughAChurn(t *testing.T) {
	one := []string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"}
	for _, c := range []struct {
		name    string
		sources []string
		resume  bool
	}{
		{"their addresses kept", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"}, false},
		{"behind the churn's address, resuming", one, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := loginUnderChurn(t, startCertRigWith(t, nil, Limits{}), c.sources, c.resume)
			t.Logf("%d of 6 agents in (round trips %v), logins %v, under a churn of %.0f connections/s", got.loggedIn, got.roundTrips, got.took, got.churnPerS)
			if got.loggedIn != 6 {
				t.Errorf("%d of 6 agents logged in through the churn, want all", got.loggedIn)
			}
			if want := 32.0 / 0.3; got.churnPerS < want {
				t.Errorf("the churn made %.0f connections/s, fewer than 32 per 300 ms round trip (%.0f/s): it proves nothing", got.churnPerS, want)
			}
		})
	}
}

// Only a session that began with a certificate that verified as a node's is resumed, and vouched for: a client
// whose certificate another CA signed gets a ticket that resumes nothing, and its connection stays in the budget
// of connections not yet authenticated.
func TestOnlyASessionOfAVerifiedNodeCertificateResumes(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{})
	stranger := testkit.NewCA(t, "not-kubeedge")
	for _, c := range []struct {
		name    string
		cert    tls.Certificate
		resumed bool
		vouched int
	}{
		{"a certificate another CA signed", stranger.Issue(t, nodeCert(stranger, "edge2")), false, 0},
		{"a node's certificate", r.ca.Issue(t, nodeCert(r.ca, "edge1")), true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cache := tls.NewLRUClientSessionCache(1)
			if mc, err := r.loginOver(lifelinev1.AgentClientID("edge1"), &c.cert, cache, "127.0.0.1", 0, 0); err == nil {
				mc.Disconnect(0)
			}
			if _, ok := cache.Get("127.0.0.1"); !ok {
				t.Fatal("no ticket issued: the test proves nothing")
			}
			conn, err := tls.Dial("tcp", r.addr, &tls.Config{RootCAs: r.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12,
				ClientSessionCache: cache, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c.cert, nil }})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if resumed := conn.ConnectionState().DidResume; resumed != c.resumed {
				t.Errorf("resumed %t, want %t", resumed, c.resumed)
			}
			l := r.broker.listener
			l.mu.Lock()
			vouched := l.nvouched
			l.mu.Unlock()
			if vouched != c.vouched {
				t.Errorf("%d connections vouched for, want %d", vouched, c.vouched)
			}
		})
	}
}
