package cloudlink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The probe follows the link: a proxy that is cut still accepts connections and closes them, which must not
// count as reachable.
func TestCloudProbeFollowsTheLink(t *testing.T) {
	cloud := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	defer cloud.Close()
	link, err := testkit.Start(cloud.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	p := &Probe{URL: "https://" + link.Addr() + "/healthz", Timeout: 500 * time.Millisecond, Period: 50 * time.Millisecond}
	go p.Run(t.Context())
	testkit.Until(t, 5*time.Second, "the cloud reachable (any answer counts)", p.Reachable)
	link.Cut()
	testkit.Until(t, 5*time.Second, "the cloud unreachable", func() bool { return !p.Reachable() })
	link.Restore()
	testkit.Until(t, 5*time.Second, "the cloud reachable again", p.Reachable)
}

// A link that drops packets closes nothing: the probe tells the cut within its timeout and period, from the kept
// connection's unanswered PING, and the node back as soon as the link passes again.
func TestCloudProbeTellsADroppingLinkWithinItsTimeout(t *testing.T) {
	cloud := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	cloud.EnableHTTP2 = true
	cloud.StartTLS()
	defer cloud.Close()
	link, err := testkit.Start(cloud.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	const timeout, period = 300 * time.Millisecond, 20 * time.Millisecond
	p := &Probe{URL: "https://" + link.Addr() + "/readyz", Timeout: timeout, Period: period}
	go p.Run(t.Context())
	<-p.Changes()
	testkit.Until(t, 5*time.Second, "the cloud reachable", p.Reachable)
	link.Blackhole()
	cut := time.Now()
	<-p.Changes()
	told := time.Since(cut)
	if p.Reachable() {
		t.Fatal("a change told, and the cloud still reachable")
	}
	// The bound is the probe's own; the slack covers a loaded machine's scheduling, not a second attempt.
	if limit := timeout + period + 200*time.Millisecond; told > limit {
		t.Errorf("the cut told after %v, want within %v", told, limit)
	}
	link.Restore()
	<-p.Changes()
	if !p.Reachable() {
		t.Fatal("a change told after the restore, and the cloud unreachable")
	}
}

// Attempts four times a second from every node must cost the cloud nothing: over HTTP/2 the probe sends its
// request once, on one connection, and PINGs it after that; a connection the server closes is replaced
// without the node ever taken as cut off.
func TestCloudProbeAsksOnceThenPingsOneConnection(t *testing.T) {
	var requests, conns, read atomic.Int64
	cloud := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if !r.ProtoAtLeast(2, 0) {
			t.Errorf("asked over %s", r.Proto)
		}
	}))
	cloud.EnableHTTP2 = true
	countConnections(cloud, &conns)
	cloud.Listener = &countingListener{Listener: cloud.Listener, read: &read}
	cloud.StartTLS()
	defer cloud.Close()
	p := &Probe{URL: cloud.URL + "/readyz", Period: time.Millisecond}
	go p.Run(t.Context())
	<-p.Changes()
	if !p.Reachable() {
		t.Fatal("the cloud unreachable")
	}
	// A hundred PING frames (17 bytes each, more in their TLS records) reach the server.
	from := read.Load()
	testkit.Until(t, 10*time.Second, "a hundred PINGs read by the server", func() bool { return read.Load()-from > 100*17 })
	if requests.Load() != 1 || conns.Load() != 1 {
		t.Errorf("%d requests on %d connections, want 1 on 1", requests.Load(), conns.Load())
	}
	cloud.CloseClientConnections()
	testkit.Until(t, 10*time.Second, "a second connection", func() bool { return conns.Load() == 2 && requests.Load() == 2 })
	select {
	case <-p.Changes():
		t.Error("a connection the server closed told as a cut")
	default:
	}
	if !p.Reachable() {
		t.Error("the cloud unreachable after the server closed the connection")
	}
}

// Over HTTP/1 (no TLS here) each attempt is the request, on a kept-alive connection.
func TestCloudProbeAsksOverHTTP1OnAKeptConnection(t *testing.T) {
	var requests, conns atomic.Int64
	cloud := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { requests.Add(1) }))
	countConnections(cloud, &conns)
	cloud.Start()
	defer cloud.Close()
	p := &Probe{URL: cloud.URL + "/healthz", Period: time.Millisecond}
	go p.Run(t.Context())
	testkit.Until(t, 10*time.Second, "twenty requests", func() bool { return requests.Load() >= 20 })
	if !p.Reachable() || conns.Load() != 1 {
		t.Errorf("reachable %v, over %d connections, want 1", p.Reachable(), conns.Load())
	}
}

// A probe whose URL is not one is never reachable, and says so once.
func TestCloudProbeOfABadURLIsNeverReachable(t *testing.T) {
	p := &Probe{URL: "cloudcore:10002", Period: time.Millisecond}
	go p.Run(t.Context())
	<-p.Changes()
	if !p.Probed() || p.Reachable() {
		t.Errorf("probed %v, reachable %v", p.Probed(), p.Reachable())
	}
}

// countConnections counts in n the connections srv (not yet started) accepts.
func countConnections(srv *httptest.Server, n *atomic.Int64) {
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
}

type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, read: l.read}, nil
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

// writeEdgecoreConfig writes an edgecore.yaml whose edgeHub reaches cloudcore's HTTPS server at httpServer and
// trusts the CA in caFile.
func writeEdgecoreConfig(t *testing.T, httpServer, caFile string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edgecore.yaml")
	cfg := "apiVersion: edgecore.config.kubeedge.io/v1alpha2\nkind: EdgeCore\nmodules:\n  edgeHub:\n    enable: true\n" +
		"    httpServer: " + httpServer + "\n    tlsCaFile: " + caFile + "\n    websocket:\n      server: 127.0.0.1:10000\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeCertPEM(t *testing.T, cert *x509.Certificate) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rootCA.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Against a real cloudcore the websocket port (10000) requires a client certificate and never answers the
// agent, so a probe of it says "cut off" for ever; the probe derived from edgecore's configuration asks
// cloudcore's HTTPS server (modules.edgeHub.httpServer, 10002) for /ca.crt, which answers without one, and
// checks its certificate against the node's copy of the cloud's CA.
func TestEdgecoreProbeReachesCloudcoreWithoutAClientCertificate(t *testing.T) {
	https := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ca.crt" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("-----BEGIN CERTIFICATE-----"))
	}))
	defer https.Close()
	websocket := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	websocket.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: x509.NewCertPool()}
	websocket.StartTLS()
	defer websocket.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old := &Probe{URL: websocket.URL + "/", Timeout: 500 * time.Millisecond, Period: 50 * time.Millisecond}
	go old.Run(ctx)

	probe, why, err := EdgecoreProbe(writeEdgecoreConfig(t, https.URL, writeCertPEM(t, https.Certificate())))
	if err != nil {
		t.Fatal(err)
	}
	if probe.URL != https.URL+"/ca.crt" || probe.TLS == nil || !strings.Contains(why, "checked against") {
		t.Fatalf("probe %s (tls %v): %s", probe.URL, probe.TLS != nil, why)
	}
	probe.Timeout, probe.Period = 500*time.Millisecond, 50*time.Millisecond
	go probe.Run(ctx)
	testkit.Until(t, 5*time.Second, "cloudcore reachable through its HTTPS server", probe.Reachable)
	if old.Reachable() {
		t.Error("the websocket port answered without a client certificate")
	}
}

// A server whose certificate the cloud's CA did not sign is not cloudcore: the node is not taken as connected.
// Without the CA file on the node the probe still works, unchecked, and says why.
func TestEdgecoreProbeChecksTheCloudsCA(t *testing.T) {
	impostor := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer impostor.Close()
	cloudCA := testkit.NewCA(t, "KubeEdge").Cert // not the impostor's
	probe, _, err := EdgecoreProbe(writeEdgecoreConfig(t, impostor.URL, writeCertPEM(t, cloudCA)))
	if err != nil {
		t.Fatal(err)
	}
	probe.Timeout, probe.Period = 500*time.Millisecond, 50*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go probe.Run(ctx)
	testkit.Until(t, 5*time.Second, "the first attempt on the impostor ended", probe.Probed)
	if probe.Reachable() {
		t.Error("a server the cloud's CA did not sign taken as cloudcore")
	}

	unchecked, why, err := EdgecoreProbe(writeEdgecoreConfig(t, impostor.URL, filepath.Join(t.TempDir(), "absent.crt")))
	if err != nil || unchecked.TLS != nil || !strings.Contains(why, "not checked") {
		t.Fatalf("without the CA file: %v, %q", err, why)
	}
	unchecked.Timeout, unchecked.Period = 500*time.Millisecond, 50*time.Millisecond
	go unchecked.Run(ctx)
	testkit.Until(t, 5*time.Second, "reachable, unchecked", unchecked.Reachable)

	for _, bad := range []string{"", "http://cloudcore:10002", "cloudcore:10002"} {
		if _, _, err := EdgecoreProbe(writeEdgecoreConfig(t, bad, "x")); err == nil {
			t.Errorf("httpServer %q accepted", bad)
		}
	}
}
