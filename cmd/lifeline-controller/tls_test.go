package main

import (
	"crypto/x509"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The broker's certificate is served as the mounted Secret's files are at each handshake: a certificate that
// cert-manager or an operator renews is served without restarting the controller.
func TestTheBrokersRenewedCertificateIsServedWithoutARestart(t *testing.T) {
	ca := testkit.NewCA(t, "lifeline-broker")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	issue := func(serial int64) {
		t.Helper()
		certPEM, keyPEM := ca.IssuePEM(t, testkit.CertOptions{CommonName: "lifeline-broker", Serial: big.NewInt(serial),
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var opts manager.Options
	if err := mqttCredentials(&opts, certFile, keyFile, "", "", "", false); err == nil {
		t.Fatal("a listener without its certificate's files was configured")
	}
	issue(7)
	if err := mqttCredentials(&opts, certFile, keyFile, "", "", "", false); err != nil {
		t.Fatal(err)
	}
	served := func() int64 {
		t.Helper()
		c, err := opts.MQTTTLS.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.Int64()
	}
	if got := served(); got != 7 {
		t.Fatalf("serial %d served, want 7", got)
	}
	issue(8)
	if got := served(); got != 8 {
		t.Errorf("serial %d served after the renewal, want 8", got)
	}
}
