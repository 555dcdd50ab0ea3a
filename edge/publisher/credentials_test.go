package publisher

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

func TestPasswordFromItsFileElseTheEnvironment(t *testing.T) {
	t.Setenv(PasswordEnv, "from-env")
	if pw, err := Password(""); err != nil || pw != "from-env" {
		t.Errorf("no file: %q, %v; want the environment's", pw, err)
	}
	file := filepath.Join(t.TempDir(), "mqtt-password")
	testkit.WriteFile(t, file, []byte("s3cret\n"))
	if pw, err := Password(file); err != nil || pw != "s3cret" {
		t.Errorf("a file: %q, %v; want its line without the newline", pw, err)
	}
	if _, err := Password(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "MQTT password") {
		t.Errorf("a missing file: %v, want an error that says what it is", err)
	}
}

func TestTLSConfigTrustsTheBrokersCAAndPresentsTheNodesCertificateOnceItExists(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "broker-ca")
	caFile := filepath.Join(dir, "ca.crt")
	testkit.WriteFile(t, caFile, ca.PEM())
	certFile, keyFile := filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")

	config, err := TLSConfig(caFile, certFile, keyFile, logr.Discard())
	if err != nil {
		t.Fatalf("a node whose certificate is not issued yet: %v", err)
	}
	if config.RootCAs == nil || config.MinVersion != tls.VersionTLS12 {
		t.Errorf("roots %v, min version %x", config.RootCAs, config.MinVersion)
	}
	if c, err := config.GetClientCertificate(&tls.CertificateRequestInfo{}); err != nil || len(c.Certificate) != 0 {
		t.Errorf("before the certificate exists: %d certificates, %v; want none, to log in by password", len(c.Certificate), err)
	}
	certPEM, keyPEM := ca.IssuePEM(t, testkit.CertOptions{CommonName: "system:node:edge-1"})
	testkit.WriteFile(t, certFile, certPEM)
	testkit.WriteFile(t, keyFile, keyPEM)
	if c, err := config.GetClientCertificate(&tls.CertificateRequestInfo{}); err != nil || len(c.Certificate) == 0 {
		t.Errorf("once issued: %v; want the node's certificate, read at the connection", err)
	}

	testkit.WriteFile(t, caFile, []byte("not a certificate"))
	if _, err := TLSConfig(caFile, "", "", logr.Discard()); err == nil {
		t.Error("a CA file without a certificate was taken")
	}
	if err := os.Remove(caFile); err != nil {
		t.Fatal(err)
	}
	if _, err := TLSConfig(caFile, "", "", logr.Discard()); err == nil {
		t.Error("a missing CA file was taken")
	}
}
