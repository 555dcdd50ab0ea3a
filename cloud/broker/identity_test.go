package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/internal/certfile"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// certRig is a TLS broker with certificate login against ca, for nodes edge1 and edge2 (passwords pw1, pw2),
// its clock a fake one.
type certRig struct {
	*rig
	ca      *testkit.CA
	roots   *x509.CertPool // the broker's own CA, for the clients
	clock   *clocktesting.FakePassiveClock
	revoked string // the revocation list's path
}

func startCertRig(t *testing.T, nodes Nodes) *certRig {
	t.Helper()
	return startCertRigWith(t, nodes, Limits{})
}

// startCertRigWith is startCertRig with the broker's limits.
func startCertRigWith(t testing.TB, nodes Nodes, limits Limits) *certRig {
	t.Helper()
	serverCert, roots := selfSignedServer(t)
	ca := testkit.NewCA(t, "kubeedge")
	dir := t.TempDir()
	for node, pw := range map[string]string{"edge1": "pw1", "edge2": "pw2"} {
		if err := os.WriteFile(filepath.Join(dir, node), []byte(pw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	revoked := filepath.Join(t.TempDir(), "revoked")
	if err := os.WriteFile(revoked, nil, 0o600); err != nil {
		t.Fatal(err)
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
	clk := clocktesting.NewFakePassiveClock(time.Now())
	b, err := Start(Config{Address: addr, Cluster: "c", CredentialsDir: dir, Tracker: tracker,
		TLS:         &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12},
		ClientCerts: ClientCerts{CAs: ca.Pool(), RevokedFile: revoked}, Nodes: nodes, Clock: clk, RecheckInterval: time.Hour,
		Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &certRig{rig: &rig{addr: addr, reg: reg, tracker: tracker, broker: b}, ca: ca, roots: roots, clock: clk, revoked: revoked}
}

// login connects over TLS with cert (none if nil) as clientID and user; onLost is told when the session ends.
func (r *certRig) login(clientID, user, password string, cert *tls.Certificate, onLost func()) (mqtt.Client, error) {
	cfg := &tls.Config{RootCAs: r.roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		// Sent whatever CAs the broker names, as the agent does: a Go client given Certificates would withhold one
		// that a foreign CA signed.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	opts := mqtt.NewClientOptions().AddBroker("ssl://" + r.addr).SetClientID(clientID).SetTLSConfig(cfg).
		SetUsername(user).SetPassword(password).SetAutoReconnect(false).SetProtocolVersion(4).
		SetConnectTimeout(5 * time.Second)
	if onLost != nil {
		opts.SetConnectionLostHandler(func(mqtt.Client, error) { onLost() })
	}
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connecting: %v", tok.Error())
	}
	return c, nil
}

// nodeCert is the certificate cloudcore issues node at keadm join: CN=system:node:<node>, O=system:nodes, client
// authentication, valid from an hour ago for a day.
func nodeCert(ca *testkit.CA, node string) testkit.CertOptions {
	now := time.Now()
	return testkit.CertOptions{CommonName: "system:node:" + node, Organization: []string{"system:nodes"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}

// [P-AUTH-5] A node's KubeEdge certificate is its identity: with it, no password is needed, the username may be
// empty or the node's, and the ACL is the one its password would give it.
func TestNodeCertificateIsTheNodesIdentity_P_AUTH_5(t *testing.T) {
	r := startCertRig(t, nil)
	cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	for _, user := range []string{"", "edge1"} {
		c, err := r.login(lifelinev1.AgentClientID("edge1"), user, "", &cert, nil)
		if err != nil {
			t.Fatalf("user %q with edge1's certificate: %v", user, err)
		}
		publish(t, c, 1, "lifeline/v1/c/nodes/edge1/birth", &lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 1})
		publish(t, c, 0, "lifeline/v1/c/nodes/edge2/birth", &lifelinev1.NodeBirth{Node: "edge2", BirthSeq: 1})
		c.Subscribe("lifeline/v1/c/nodes/edge2/commands", 1, nil).WaitTimeout(5 * time.Second)
		got := make(chan string, 1)
		c.Subscribe("lifeline/v1/c/nodes/edge1/commands", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() }).WaitTimeout(5 * time.Second)
		if err := r.broker.PublishCommand("edge1", []byte("cmd")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("user %q: edge1's command did not reach it", user)
		}
		c.Disconnect(0)
	}
	testkit.Until(t, 5*time.Second, "edge1's births accepted, edge2's forged ones and the subscription denied", func() bool {
		return r.count("lifeline_liveness_messages_total", "birth") >= 1 && r.count("lifeline_liveness_dropped_total", liveness.DropDenied) == 4
	})
	// A node without a certificate still logs in by its password.
	c, err := r.login(lifelinev1.AgentClientID("edge2"), "edge2", "pw2", nil, nil)
	if err != nil {
		t.Fatalf("password login beside certificate login: %v", err)
	}
	c.Disconnect(0)
}

// [P-AUTH-5] [P-AUTH-4] Every certificate that does not make its holder the node it claims is refused and
// counted by reason, whatever password comes with it.
func TestBadNodeCertificatesAreRefused_P_AUTH_5(t *testing.T) {
	r := startCertRig(t, nil)
	stranger := testkit.NewCA(t, "not-kubeedge")
	good := nodeCert(r.ca, "edge1")
	with := func(f func(*testkit.CertOptions)) testkit.CertOptions { o := good; f(&o); return o }
	cases := []struct {
		name     string
		ca       *testkit.CA
		opts     testkit.CertOptions
		clientID string
		user     string
		reason   string
	}{
		{"signed by another CA", stranger, good, "", "", RefusedCertificate},
		{"CN not a node's", r.ca, with(func(o *testkit.CertOptions) { o.CommonName = "edge1" }), "", "", RefusedCertificate},
		{"O not system:nodes", r.ca, with(func(o *testkit.CertOptions) { o.Organization = []string{"KubeEdge"} }), "", "", RefusedCertificate},
		{"extra O", r.ca, with(func(o *testkit.CertOptions) { o.Organization = []string{"system:nodes", "system:masters"} }), "", "", RefusedCertificate},
		{"server authentication only", r.ca, with(func(o *testkit.CertOptions) { o.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }), "", "", RefusedCertificate},
		{"expired", r.ca, with(func(o *testkit.CertOptions) { o.NotAfter = time.Now().Add(-time.Minute) }), "", "", RefusedCertificate},
		{"not yet valid", r.ca, with(func(o *testkit.CertOptions) { o.NotBefore = time.Now().Add(time.Hour) }), "", "", RefusedCertificate},
		{"username of another node, with its password", r.ca, good, lifelinev1.AgentClientID("edge2"), "edge2", liveness.DropAuth},
		{"username of another node, own client id", r.ca, good, "", "edge2", liveness.DropAuth},
		{"another node's client id", r.ca, good, lifelinev1.AgentClientID("edge2"), "", RefusedClientID},
		{"revoked", r.ca, with(func(o *testkit.CertOptions) { o.Serial = big.NewInt(0xdead) }), "", "", RefusedRevoked},
	}
	if err := os.WriteFile(r.revoked, []byte("# leaked\nDE:AD\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cert := tc.ca.Issue(t, tc.opts)
			clientID := tc.clientID
			if clientID == "" {
				clientID = lifelinev1.AgentClientID("edge1")
			}
			before := r.count("lifeline_liveness_dropped_total", tc.reason)
			if c, err := r.login(clientID, tc.user, "pw2", &cert, nil); err == nil {
				c.Disconnect(0)
				t.Fatal("admitted")
			}
			testkit.Until(t, 5*time.Second, "the refusal counted as "+tc.reason, func() bool {
				return r.count("lifeline_liveness_dropped_total", tc.reason) == before+1
			})
		})
	}
	if n := r.count("lifeline_liveness_messages_total", "birth"); n != 0 {
		t.Errorf("%v births from refused clients", n)
	}
}

// A serial revoked while its node is connected: the next check of the live sessions ends its session, and it
// cannot log in again; the list is read again as it changes, so a serial taken off it is admitted again.
func TestRevokedCertificateEndsItsSessionAndIsRefused(t *testing.T) {
	r := startCertRig(t, nil)
	opts := nodeCert(r.ca, "edge1")
	opts.Serial = big.NewInt(0x1a2b3c)
	cert := r.ca.Issue(t, opts)
	lost := make(chan struct{}, 1)
	c, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, func() { lost <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(0)
	if ended := r.broker.Recheck(); len(ended) != 0 {
		t.Fatalf("sessions ended before any revocation: %v", ended)
	}
	if err := os.WriteFile(r.revoked, []byte("serial=1A2B3C\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"edge1"}, r.broker.Recheck()); diff != "" {
		t.Errorf("sessions ended (-want +got):\n%s", diff)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked certificate's session stayed open")
	}
	if _, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, nil); err == nil {
		t.Fatal("a revoked certificate logged in")
	}
	if err := os.WriteFile(r.revoked, []byte("# none\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, nil)
	if err != nil {
		t.Fatalf("a serial taken off the list is still refused: %v", err)
	}
	again.Disconnect(0)
}

// A certificate that expires while its session is live ends that session at the next check, by the broker's
// clock; the node's rotated certificate logs in again.
func TestExpiredCertificateEndsItsSession(t *testing.T) {
	r := startCertRig(t, nil)
	opts := nodeCert(r.ca, "edge1")
	opts.NotAfter = time.Now().Add(time.Hour)
	cert := r.ca.Issue(t, opts)
	lost := make(chan struct{}, 1)
	c, err := r.login(lifelinev1.AgentClientID("edge1"), "edge1", "", &cert, func() { lost <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(0)
	r.clock.SetTime(time.Now().Add(2 * time.Hour))
	if diff := cmp.Diff([]string{"edge1"}, r.broker.Recheck()); diff != "" {
		t.Errorf("sessions ended (-want +got):\n%s", diff)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the expired certificate's session stayed open")
	}
	rotated := nodeCert(r.ca, "edge1")
	rotated.NotAfter = time.Now().Add(48 * time.Hour)
	next := r.ca.Issue(t, rotated)
	if c, err := r.login(lifelinev1.AgentClientID("edge1"), "edge1", "", &next, nil); err != nil {
		t.Fatalf("the rotated certificate: %v", err)
	} else {
		c.Disconnect(0)
	}
}

// While the revocation list cannot be read, no certificate is admitted: a list an operator relies on is never
// skipped silently.
func TestUnreadableRevocationListRefusesCertificates(t *testing.T) {
	r := startCertRig(t, nil)
	cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	if err := os.WriteFile(r.revoked, []byte("not hex\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, nil); err == nil {
		t.Fatal("admitted while the revocation list does not parse")
	}
	if err := os.Remove(r.revoked); err != nil {
		t.Fatal(err)
	}
	if _, err := r.login(lifelinev1.AgentClientID("edge1"), "", "", &cert, nil); err == nil {
		t.Fatal("admitted while the revocation list is missing")
	}
	if got := r.count("lifeline_liveness_dropped_total", RefusedRevoked); got != 2 {
		t.Errorf("%v refusals counted as revoked, want 2", got)
	}
}

func TestCertificateLoginNeedsTLS(t *testing.T) {
	tracker, err := liveness.NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ca := testkit.NewCA(t, "kubeedge")
	if b, err := Start(Config{Address: "127.0.0.1:0", Cluster: "c", Tracker: tracker, ClientCerts: ClientCerts{CAs: ca.Pool()}}); err == nil {
		b.Close()
		t.Fatal("a plain listener with certificate login started")
	}
}

func TestParseSerials(t *testing.T) {
	cases := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "", want: []string{}},
		{in: "# comment only\n\n", want: []string{}},
		{in: "1A2B\n", want: []string{"1a2b"}},
		{in: "serial=00FF\n0x10 # leaked laptop\n", want: []string{"ff", "10"}},
		{in: "de:ad:be:ef\r\n", want: []string{"deadbeef"}},
		{in: "12\nzz\n", wantErr: true},
		{in: "-5\n", wantErr: true},
	}
	for _, tc := range cases {
		got, err := parseSerials([]byte(tc.in))
		if (err != nil) != tc.wantErr {
			t.Errorf("parseSerials(%q) error %v, want error %t", tc.in, err, tc.wantErr)
			continue
		}
		if tc.wantErr {
			continue
		}
		want := map[string]bool{}
		for _, s := range tc.want {
			want[s] = true
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("parseSerials(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

func TestNodeFromCertificate(t *testing.T) {
	cases := []struct {
		cn      string
		orgs    []string
		want    string
		wantErr bool
	}{
		{cn: "system:node:edge1", orgs: []string{"system:nodes"}, want: "edge1"},
		{cn: "system:node:edge-1.example.com", orgs: []string{"system:nodes"}, want: "edge-1.example.com"},
		{cn: "system:node:", orgs: []string{"system:nodes"}, wantErr: true},
		{cn: "system:node:Edge1", orgs: []string{"system:nodes"}, wantErr: true},
		{cn: "system:node:edge1/x", orgs: []string{"system:nodes"}, wantErr: true},
		{cn: "edge1", orgs: []string{"system:nodes"}, wantErr: true},
		{cn: "kubeedge.io", orgs: []string{"KubeEdge"}, wantErr: true}, // KubeEdge's old shared certificate names no node
		{cn: "system:node:edge1", orgs: nil, wantErr: true},
		{cn: "system:node:edge1", orgs: []string{"system:masters", "system:nodes"}, wantErr: true},
	}
	for _, tc := range cases {
		got, err := nodeFromCertificate(&x509.Certificate{Subject: pkix.Name{CommonName: tc.cn, Organization: tc.orgs}})
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("nodeFromCertificate(CN=%s, O=%v) = %q, %v; want %q, error %t", tc.cn, tc.orgs, got, err, tc.want, tc.wantErr)
		}
	}
}

// The agent's publisher with its certificate read from files that edgecore rotates: after a rotation, the
// session on the old certificate ends (here by its revocation) and the agent reconnects with the new one,
// without a restart and without a password.
func TestAgentPicksUpARotatedCertificate(t *testing.T) {
	r := startCertRig(t, nil)
	dir := t.TempDir()
	pair := &certfile.Pair{CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key")}
	write := func(serial int64) {
		opts := nodeCert(r.ca, "edge1")
		opts.Serial = big.NewInt(serial)
		certPEM, keyPEM := r.ca.IssuePEM(t, opts)
		testkit.WriteFile(t, pair.CertFile, certPEM) // as edgecore writes them: the certificate first
		testkit.WriteFile(t, pair.KeyFile, keyPEM)
	}
	write(0xa1)
	state := t.TempDir()
	j, err := journal.Open(filepath.Join(state, "journal.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	p := publisher.New(publisher.Config{Broker: "ssl://" + r.addr, Username: "edge1", Cluster: "c", Node: "edge1", StateDir: state,
		TLS:           &tls.Config{RootCAs: r.roots, MinVersion: tls.VersionTLS12, GetClientCertificate: pair.GetClientCertificate},
		RetryInterval: 100 * time.Millisecond}, j)
	testkit.Background(t, context.Background(), p.Run)
	testkit.Until(t, 5*time.Second, "the agent's birth on its first certificate", func() bool {
		return p.Connected() && r.count("lifeline_liveness_messages_total", "birth") == 1
	})
	write(0xb2)
	testkit.WriteFile(t, r.revoked, []byte("a1\n"))
	if diff := cmp.Diff([]string{"edge1"}, r.broker.Recheck()); diff != "" {
		t.Fatalf("sessions ended (-want +got):\n%s", diff)
	}
	testkit.Until(t, 5*time.Second, "the agent's birth on its rotated certificate", func() bool {
		return p.Connected() && r.count("lifeline_liveness_messages_total", "birth") == 2
	})
}

// A node's password removed from the Secret (its key deleted) or changed while its agent is connected: the next
// check of the live sessions ends its session, and the old password no longer logs in; the new one does.
func TestRemovedOrChangedPasswordEndsItsSession(t *testing.T) {
	r := startRig(t, nil)
	lost := map[string]chan struct{}{"edge1": make(chan struct{}, 1), "edge2": make(chan struct{}, 1)}
	for node, pw := range map[string]string{"edge1": "pw1", "edge2": "pw2"} {
		c, err := r.connectAs(lifelinev1.AgentClientID(node), node, pw, "", func() { lost[node] <- struct{}{} })
		if err != nil {
			t.Fatal(err)
		}
		defer c.Disconnect(0)
	}
	if ended := r.broker.Recheck(); len(ended) != 0 {
		t.Fatalf("sessions ended before any password changed: %v", ended)
	}
	dir := r.broker.access.dir
	if err := os.Remove(filepath.Join(dir, "edge1")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edge2"), []byte("pw2-rotated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ended := r.broker.Recheck()
	slices.Sort(ended)
	if diff := cmp.Diff([]string{"edge1", "edge2"}, ended); diff != "" {
		t.Errorf("sessions ended (-want +got):\n%s", diff)
	}
	for node, ch := range lost {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s's session stayed open after its password went", node)
		}
	}
	if _, err := r.connect("edge1", "pw1", ""); err == nil {
		t.Error("a removed password logged in")
	}
	if _, err := r.connect("edge2", "pw2", ""); err == nil {
		t.Error("a replaced password logged in")
	}
	c, err := r.connect("edge2", "pw2-rotated", "")
	if err != nil {
		t.Fatalf("the new password: %v", err)
	}
	defer c.Disconnect(0)
	if ended := r.broker.Recheck(); len(ended) != 0 {
		t.Errorf("the session on the new password ended: %v", ended)
	}
}

// A standard CRL revokes what it lists, in PEM (as openssl writes it) or DER; a text list that begins with 0 is
// still a list; another PEM block is refused.
func TestRevokedFromACRL(t *testing.T) {
	ca := testkit.NewCA(t, "kubeedge")
	der := ca.CRL(t, big.NewInt(0x1a2b), big.NewInt(0xff))
	for name, data := range map[string][]byte{
		"PEM": pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}),
		"DER": der,
	} {
		got, err := parseRevoked(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := map[string]bool{"1a2b": true, "ff": true}; !cmp.Equal(got, want) {
			t.Errorf("%s: revoked %v, want %v", name, got, want)
		}
	}
	if got, err := parseRevoked([]byte("0a\n")); err != nil || !got["a"] {
		t.Errorf("a serial list beginning with 0: %v %v", got, err)
	}
	if _, err := parseRevoked(ca.PEM()); err == nil {
		t.Error("a certificate taken for a CRL")
	}
}
