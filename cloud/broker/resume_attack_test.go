package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/publisher"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// clientTLS is an agent's TLS configuration towards r's broker: it presents cert (none if nil) on a full
// handshake and resumes the sessions of cache.
func (r *certRig) clientTLS(cert *tls.Certificate, cache tls.ClientSessionCache) *tls.Config {
	return &tls.Config{RootCAs: r.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12, ClientSessionCache: cache,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert == nil {
				return &tls.Certificate{}, nil
			}
			return cert, nil
		}}
}

// tlsFrom completes a TLS handshake with r's broker from source, and sends nothing more: a login whose CONNECT is
// still on its way.
func (r *certRig) tlsFrom(t *testing.T, source string, cfg *tls.Config) *tls.Conn {
	t.Helper()
	c := tls.Client(dialFrom(t, r.addr, source), cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		t.Fatalf("TLS handshake from %s: %v", source, err)
	}
	t.Cleanup(func() { c.Close() }) // before the broker closes: mochi's Close races a connection it is admitting
	return c
}

// firstLogin logs node in by certificate from source and returns the session cache that holds its session.
func (r *certRig) firstLogin(t testing.TB, node string, cert *tls.Certificate, source string) tls.ClientSessionCache {
	t.Helper()
	cache := tls.NewLRUClientSessionCache(4)
	c, err := r.loginOver(lifelinev1.AgentClientID(node), cert, cache, source, 0, 0)
	if err != nil {
		t.Fatalf("node %s's first login: %v", node, err)
	}
	c.Disconnect(0)
	return cache
}

// recordHello is the first flight (the ClientHello) of a TLS handshake with cfg from source, as an eavesdropper
// on the agent's path sees it.
func (r *certRig) recordHello(t *testing.T, cfg *tls.Config, source string) []byte {
	t.Helper()
	rec := &firstFlight{Conn: dialFrom(t, r.addr, source)}
	tc := tls.Client(rec, cfg)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if !tc.ConnectionState().DidResume {
		t.Fatal("the recorded handshake did not resume: the test proves nothing")
	}
	tc.Close()
	return rec.written
}

// mqttConnect sends an MQTT 3.1.1 CONNECT (no credentials) for clientID over conn and returns the CONNACK's return
// code, or the error when the broker closed the connection instead of answering.
func mqttConnect(conn net.Conn, clientID string) (byte, error) {
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, byte(len(clientID) >> 8), byte(len(clientID))}
	body = append(body, clientID...)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write(append(connectHeader(len(body)), body...)); err != nil {
		return 0, err
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(conn, ack); err != nil {
		return 0, err
	}
	if ack[0] != 0x20 {
		return 0, fmt.Errorf("a packet of type %#x, not a CONNACK", ack[0])
	}
	return ack[3], nil
}

// vouchedFor is how many connections the listener holds vouched for node.
func vouchedFor(l *guardedListener, node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.vouched[node]; q != nil {
		return q.Len()
	}
	return 0
}

// answered waits until the broker sends something on conn (a ServerHello, an alert) or closes it: it has read
// what conn sent.
func answered(t testing.TB, conn net.Conn) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := conn.Read(make([]byte, 1)); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("no answer from the broker: %v", err)
	}
}

// withPSKModes is a ClientHello b whose psk_key_exchange_modes extension offers mode alone (its length kept: b
// offered one mode).
func withPSKModes(b []byte, mode byte) []byte {
	b = slices.Clone(b)
	rest := b[5+4+34:] // record and handshake headers, legacy version and random
	for _, width := range []int{1, 2, 1} {
		field, _ := prefixed(rest, width)
		rest = rest[width+len(field):]
	}
	extensions, _ := prefixed(rest, 2)
	for len(extensions) >= 4 {
		data, _ := prefixed(extensions[2:], 2)
		if extensions[0] == 0 && extensions[1] == 45 && len(data) == 2 {
			data[1] = mode
			return b
		}
		extensions = extensions[4+len(data):]
	}
	panic("no psk_key_exchange_modes of one mode")
}

// A ticket travels in the clear in every ClientHello that resumes it. Whoever saw an agent's hello once sends it
// again, as it was or with its binder broken (it cannot compute one), from another address: neither proves the
// session's key, so neither may take the place of the agent's own login, which from its own address was safe in
// its source's budget before resumption vouched for it (a connection from another source never closes it there).
func TestAReplayedHelloDoesNotEvictTheNodesLogin(t *testing.T) {
	for _, c := range []struct {
		name   string
		tamper func([]byte) []byte
	}{
		{"replayed as seen", func(b []byte) []byte { return b }},
		// Without psk_dhe_ke crypto/tls ignores the ticket, binder and all, and goes on with a full handshake,
		// which waits for the client's Finished: only the accept's look at the hello vouches.
		{"its key exchange mode psk_ke", func(b []byte) []byte { return withPSKModes(b, 0) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startCertRigWith(t, nil, Limits{})
			cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
			cache := r.firstLogin(t, "edge1", &cert, "127.0.0.2")
			seen := r.recordHello(t, r.clientTLS(&cert, cache), "127.0.0.2")
			// The agent resumes from its own address, its CONNECT a round trip away; the accept sees a replayed
			// hello that came in time, not every one.
			agent := r.tlsFrom(t, "127.0.0.2", r.clientTLS(&cert, cache))
			for range 10 * vouchedPerNode {
				conn := dialFrom(t, r.addr, "127.0.0.3")
				if _, err := conn.Write(c.tamper(seen)); err != nil {
					t.Fatal(err)
				}
				answered(t, conn)
			}
			if code, err := mqttConnect(agent, lifelinev1.AgentClientID("edge1")); err != nil || code != 0 {
				t.Errorf("the agent's login from its own address ended (CONNACK %d, %v) after %d hellos replayed from another: %v evicted",
					code, err, 10*vouchedPerNode, r.count(dropped, RefusedPreAuthEvicted))
			}
		})
	}
}

// A certificate stolen and revoked: its thief logged in with it before the revocation, and keeps the session's
// ticket and secret. The session is resumed no more, nor vouched for as the node's, nor closes the logins of the
// node's agent, which has a new certificate.
func TestARevokedCertificatesTicketVouchesNoMore(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{})
	stolen := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	thief := r.firstLogin(t, "edge1", &stolen, "127.0.0.3")
	testkit.WriteFile(t, r.revoked, []byte(stolen.Leaf.SerialNumber.Text(16)+"\n"))
	renewed := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	cache := r.firstLogin(t, "edge1", &renewed, "127.0.0.2")
	agent := r.tlsFrom(t, "127.0.0.2", r.clientTLS(&renewed, cache))
	l := r.broker.listener
	before := vouchedFor(l, "edge1")
	for range vouchedPerNode {
		if c := r.tlsFrom(t, "127.0.0.3", r.clientTLS(&stolen, thief)); c.ConnectionState().DidResume {
			t.Error("the revoked certificate's session was resumed")
		}
	}
	if after := vouchedFor(l, "edge1"); after > before {
		t.Errorf("resuming the revoked certificate's session vouched for %d connections as edge1's", after-before)
	}
	if code, err := mqttConnect(agent, lifelinev1.AgentClientID("edge1")); err != nil || code != 0 {
		t.Errorf("the agent with edge1's renewed certificate was refused (CONNACK %d, %v) after the revoked one's thief resumed: %v evicted",
			code, err, r.count(dropped, RefusedPreAuthEvicted))
	}
}

// A node's TLS 1.3 ticket, offered in a TLS 1.2 hello (its SessionTicket extension, which the accept's look
// does not read), is one crypto/tls does not resume: the handshake is a full one, here by a client with no
// certificate at all. It must not be vouched for as the node's.
func TestATicketInATLS12HelloVouchesNoFullHandshake(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{})
	cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	cache := r.firstLogin(t, "edge1", &cert, "127.0.0.2")
	cs, ok := cache.Get("127.0.0.1")
	if !ok {
		t.Fatal("no session cached")
	}
	ticket, _, err := cs.ResumptionState()
	if err != nil {
		t.Fatal(err)
	}
	own := tls.NewLRUClientSessionCache(1)
	cfg12 := &tls.Config{RootCAs: r.roots, ServerName: "127.0.0.1", MaxVersion: tls.VersionTLS12, ClientSessionCache: own}
	r.tlsFrom(t, "127.0.0.3", cfg12).Close() // a TLS 1.2 session of its own, with no certificate
	mine, ok := own.Get("127.0.0.1")
	if !ok {
		t.Fatal("no TLS 1.2 session cached")
	}
	_, state, err := mine.ResumptionState()
	if err != nil {
		t.Fatal(err)
	}
	forged, err := tls.NewResumptionState(ticket, state)
	if err != nil {
		t.Fatal(err)
	}
	own.Put("127.0.0.1", forged)
	c := r.tlsFrom(t, "127.0.0.3", cfg12)
	if st := c.ConnectionState(); st.DidResume || len(st.PeerCertificates) == 0 {
		t.Fatalf("resumed %t: the test proves nothing", st.DidResume)
	}
	// The client's handshake ends when it reads the broker's Finished, the broker's once it sent it: the broker
	// unvouches just after. Left vouched for, the connection would stay so until its CONNECT timeout (5 s).
	testkit.Until(t, 2*time.Second, "a full TLS 1.2 handshake with no certificate that offered edge1's ticket no longer vouched for as edge1's",
		func() bool { return vouchedFor(r.broker.listener, "edge1") == 0 })
}

// A session is resumed for a day at most, by the broker's clock: a ticket seen on the wire longer ago resumes
// nothing, and vouches for nothing.
func TestATicketPastItsLifetimeDoesNotVouch(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{})
	o := nodeCert(r.ca, "edge1")
	o.NotAfter = time.Now().Add(60 * 24 * time.Hour)
	cert := r.ca.Issue(t, o)
	cache := r.firstLogin(t, "edge1", &cert, "127.0.0.2")
	r.clock.SetTime(r.clock.Now().Add(sessionLifetime + time.Minute))
	c := r.tlsFrom(t, "127.0.0.3", r.clientTLS(nil, cache))
	if c.ConnectionState().DidResume {
		t.Error("a session past its lifetime was resumed")
	}
	if n := vouchedFor(r.broker.listener, "edge1"); n != 0 {
		t.Errorf("a full handshake with no certificate that offered edge1's ticket past its lifetime is vouched for as edge1's (%d)", n)
	}
}

// Connections vouched for, evicted, timed out, refused, authenticated or closed by their clients, mixed with a
// churn: once all are gone the listener holds none of them in any of its accounts.
func TestVouchedConnectionsLeaveNothingBehind(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{MaxUnauthenticated: 8, MaxUnauthenticatedPerSource: 4,
		HandshakeTimeout: 300 * time.Millisecond, ConnectTimeout: 600 * time.Millisecond})
	type node struct {
		name  string
		cert  tls.Certificate
		cache tls.ClientSessionCache
		hello []byte
	}
	var nodes []*node
	for _, name := range []string{"edge1", "edge2"} {
		n := &node{name: name, cert: r.ca.Issue(t, nodeCert(r.ca, name))}
		n.cache = r.firstLogin(t, name, &n.cert, "127.0.0.2")
		n.hello = r.recordHello(t, r.clientTLS(&n.cert, n.cache), "127.0.0.2")
		nodes = append(nodes, n)
	}
	var wg sync.WaitGroup
	for i := range 80 {
		n := nodes[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%3))}}).Dial("tcp", r.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer raw.Close()
			_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
			tc := tls.Client(raw, r.clientTLS(&n.cert, n.cache))
			switch i % 6 {
			case 0: // closed by its client right after the handshake
				_ = tc.Handshake()
			case 1: // logs in, and out
				if tc.Handshake() == nil {
					_, _ = mqttConnect(tc, lifelinev1.AgentClientID(n.name))
				}
			case 2: // never sends its CONNECT: timed out
				if tc.Handshake() == nil {
					_, _ = io.Copy(io.Discard, tc)
				}
			case 3: // a replayed hello: the handshake stalls
				_, _ = raw.Write(n.hello)
				_, _ = io.Copy(io.Discard, raw)
			case 4: // a broken binder: the handshake fails
				b := slices.Clone(n.hello)
				b[len(b)-1] ^= 0xff
				_, _ = raw.Write(b)
				_, _ = io.Copy(io.Discard, raw)
			case 5: // the wrong client id: refused at CONNECT
				if tc.Handshake() == nil {
					_, _ = mqttConnect(tc, "intruder")
				}
			}
		}()
		if i%4 == 0 {
			c, err := net.Dial("tcp", r.addr)
			if err == nil {
				_, _ = c.Write(tlsHelloHeader)
				defer c.Close()
			}
		}
	}
	wg.Wait()
	l := r.broker.listener
	testkit.Until(t, 10*time.Second, "every connection released", func() bool { return l.open() == 0 })
	if r.count(dropped, RefusedPreAuthEvicted) == 0 {
		t.Error("no connection evicted: the test proves nothing")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.npending != 0 || l.nvouched != 0 || len(l.pending) != 0 || len(l.vouched) != 0 || len(l.sessions) != 0 || len(l.nodes) != 0 {
		t.Errorf("left behind: %d pending (%d sources), %d vouched (%d nodes), %d sessions, %d nodes",
			l.npending, len(l.pending), l.nvouched, len(l.vouched), len(l.sessions), len(l.nodes))
	}
}

// The listener's Close closes the connections vouched for too.
func TestCloseClosesVouchedConnections(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{ConnectTimeout: time.Hour, HandshakeTimeout: time.Hour})
	cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	cache := r.firstLogin(t, "edge1", &cert, "127.0.0.2")
	agent := r.tlsFrom(t, "127.0.0.2", r.clientTLS(&cert, cache))
	if n := vouchedFor(r.broker.listener, "edge1"); n != 1 {
		t.Fatalf("%d connections vouched for, want 1: the test proves nothing", n)
	}
	r.broker.listener.Close(func(string) {}) // as Broker.Close does (the rig's cleanup calls that, and only once)
	if !closedByServer(t, agent, 5*time.Second) {
		t.Error("a connection vouched for is still open after the broker closed")
	}
}

// edgecore rotates the node's certificate while the agent's login is under way: the session's ticket reaches
// the agent after the rotation. Once the old certificate is revoked, the agent must log in with the new one,
// not resume the old one's session at every reconnect.
func TestAnAgentRotatedDuringItsLoginLogsInWithTheNewCertificate(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{})
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	rotate := func() *x509.Certificate {
		certPEM, keyPEM := r.ca.IssuePEM(t, nodeCert(r.ca, "edge1"))
		testkit.WriteFile(t, certFile, certPEM)
		testkit.WriteFile(t, keyFile, keyPEM)
		block, _ := pem.Decode(certPEM)
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := rotate()
	cfg, err := publisher.TLSConfig("", certFile, keyFile, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RootCAs, cfg.ServerName = r.roots, "127.0.0.1"
	id := lifelinev1.AgentClientID("edge1")
	c := r.tlsFrom(t, "127.0.0.2", cfg)
	rotate()
	if code, err := mqttConnect(c, id); err != nil || code != 0 {
		t.Fatalf("the login under way: CONNACK %d, %v", code, err)
	}
	c.Close()
	testkit.WriteFile(t, r.revoked, []byte(old.SerialNumber.Text(16)+"\n"))
	for i := range 3 {
		c := r.tlsFrom(t, "127.0.0.2", cfg)
		code, err := mqttConnect(c, id)
		if err != nil || code != 0 {
			t.Errorf("reconnect %d: refused (CONNACK %d, %v), resumed %t: the agent presents the revoked certificate's session",
				i+1, code, err, c.ConnectionState().DidResume)
		}
		c.Close()
	}
}

// The accept's reading of a ClientHello agrees with crypto/tls, which refuses a hello whose pre_shared_key is not
// its last extension (RFC 8446, 4.2.11): such a hello offers no ticket.
func TestOfferedTicketsOnlyFromTheLastExtension(t *testing.T) {
	ext := func(kind uint16, data []byte) []byte {
		return append([]byte{byte(kind >> 8), byte(kind), byte(len(data) >> 8), byte(len(data))}, data...)
	}
	identity := []byte("ticket")
	identities := append([]byte{0, byte(len(identity))}, identity...)
	identities = append(identities, 0, 0, 0, 0)
	binders := append([]byte{32}, make([]byte, 32)...)
	psk := append([]byte{0, byte(len(identities))}, identities...)
	psk = append(psk, 0, byte(len(binders)))
	psk = append(psk, binders...)
	hello := func(exts ...[]byte) []byte {
		body := append([]byte{3, 3}, make([]byte, 32)...) // legacy version, random
		body = append(body, 0, 0, 2, 0x13, 0x01, 1, 0)    // session id, cipher suites, compression methods
		all := slices.Concat(exts...)
		body = append(body, byte(len(all)>>8), byte(len(all)))
		body = append(body, all...)
		hs := append([]byte{1, 0, byte(len(body) >> 8), byte(len(body))}, body...)
		return append([]byte{22, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
	}
	versions := ext(43, []byte{2, 3, 4})
	if got := offeredTickets(hello(versions, ext(41, psk))); len(got) != 1 || string(got[0]) != "ticket" {
		t.Fatalf("a well-formed hello offers %q, want the ticket", got)
	}
	if got := offeredTickets(hello(ext(41, psk), versions)); len(got) != 0 {
		t.Errorf("a hello whose pre_shared_key is not last, which crypto/tls refuses, offers %q", got)
	}
}
