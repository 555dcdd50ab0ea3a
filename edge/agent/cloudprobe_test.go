package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/test/netproxy"
	"github.com/lifeline-edge/lifeline/test/pkitest"
)

// The probe follows the link: a proxy that is cut still accepts connections and closes them, which must not
// count as reachable.
func TestCloudProbeFollowsTheLink(t *testing.T) {
	cloud := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	defer cloud.Close()
	link, err := netproxy.Start(cloud.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	p := &CloudProbe{URL: "https://" + link.Addr() + "/healthz", Timeout: 500 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx, 50*time.Millisecond)
	waitFor(t, 5*time.Second, "the cloud reachable (any answer counts)", p.Reachable)
	link.Cut()
	waitFor(t, 5*time.Second, "the cloud unreachable", func() bool { return !p.Reachable() })
	link.Restore()
	waitFor(t, 5*time.Second, "the cloud reachable again", p.Reachable)
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
	old := &CloudProbe{URL: websocket.URL + "/", Timeout: 500 * time.Millisecond}
	go old.Run(ctx, 50*time.Millisecond)

	probe, why, err := EdgecoreProbe(writeEdgecoreConfig(t, https.URL, writeCertPEM(t, https.Certificate())))
	if err != nil {
		t.Fatal(err)
	}
	if probe.URL != https.URL+"/ca.crt" || probe.TLS == nil || !strings.Contains(why, "checked against") {
		t.Fatalf("probe %s (tls %v): %s", probe.URL, probe.TLS != nil, why)
	}
	probe.Timeout = 500 * time.Millisecond
	go probe.Run(ctx, 50*time.Millisecond)
	waitFor(t, 5*time.Second, "cloudcore reachable through its HTTPS server", probe.Reachable)
	if old.Reachable() {
		t.Error("the websocket port answered without a client certificate")
	}
}

// A server whose certificate the cloud's CA did not sign is not cloudcore: the node is not taken as connected.
// Without the CA file on the node the probe still works, unchecked, and says why.
func TestEdgecoreProbeChecksTheCloudsCA(t *testing.T) {
	impostor := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer impostor.Close()
	cloudCA := pkitest.NewCA(t, "KubeEdge").Cert // not the impostor's
	probe, _, err := EdgecoreProbe(writeEdgecoreConfig(t, impostor.URL, writeCertPEM(t, cloudCA)))
	if err != nil {
		t.Fatal(err)
	}
	probe.Timeout = 500 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go probe.Run(ctx, 50*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	if probe.Reachable() {
		t.Error("a server the cloud's CA did not sign taken as cloudcore")
	}

	unchecked, why, err := EdgecoreProbe(writeEdgecoreConfig(t, impostor.URL, filepath.Join(t.TempDir(), "absent.crt")))
	if err != nil || unchecked.TLS != nil || !strings.Contains(why, "not checked") {
		t.Fatalf("without the CA file: %v, %q", err, why)
	}
	unchecked.Timeout = 500 * time.Millisecond
	go unchecked.Run(ctx, 50*time.Millisecond)
	waitFor(t, 5*time.Second, "reachable, unchecked", unchecked.Reachable)

	for _, bad := range []string{"", "http://cloudcore:10002", "cloudcore:10002"} {
		if _, _, err := EdgecoreProbe(writeEdgecoreConfig(t, bad, "x")); err == nil {
			t.Errorf("httpServer %q accepted", bad)
		}
	}
}
