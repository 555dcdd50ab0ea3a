package certfile

import (
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

func issue(t *testing.T, ca *testkit.CA) (certPEM, keyPEM []byte) {
	return ca.IssuePEM(t, testkit.CertOptions{CommonName: "system:node:edge1", Organization: []string{"system:nodes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// Files rotated as edgecore rotates them: the certificate first, then the key. In between, the old pair stays
// in use; once both are written, the new one is.
func TestRotationHalfWrittenKeepsTheOldPair(t *testing.T) {
	ca := testkit.NewCA(t, "kubeedge")
	dir := t.TempDir()
	p := &Pair{CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key")}
	if err := p.Load(); err != nil {
		t.Fatalf("no files yet is no error: %v", err)
	}
	if c, _ := p.GetClientCertificate(nil); len(c.Certificate) != 0 {
		t.Fatal("a certificate presented before any file exists")
	}
	cert1, key1 := issue(t, ca)
	testkit.WriteFile(t, p.CertFile, cert1)
	testkit.WriteFile(t, p.KeyFile, key1)
	first := p.Current()
	if first == nil {
		t.Fatal("the pair written is not loaded")
	}
	cert2, key2 := issue(t, ca)
	testkit.WriteFile(t, p.CertFile, cert2)
	if got := p.Current(); got == nil || got.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Fatalf("with the key not yet rotated, the pair in use is %v, want the old one", got)
	}
	testkit.WriteFile(t, p.KeyFile, key2)
	got, err := p.GetClientCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Fatal("the rotated pair is not in use")
	}
	testkit.WriteFile(t, p.KeyFile, []byte("garbage"))
	if err := (&Pair{CertFile: p.CertFile, KeyFile: p.KeyFile}).Load(); err == nil {
		t.Error("a pair that does not parse loaded without error")
	}
}
