package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"net"
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

// A client resumes its TLS session while its certificate stays the same (the server sees the certificate the
// session began with), and logs in by a full handshake once it was rotated, presenting the new one.
func TestSessionsAreResumedOnlyWithTheCertificateTheyBeganWith(t *testing.T) {
	ca := testkit.NewCA(t, "kubeedge")
	server := ca.Issue(t, testkit.CertOptions{CommonName: "broker", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequestClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := make(chan *x509.Certificate, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if tc.Handshake() == nil {
				seen <- tc.ConnectionState().PeerCertificates[0]
				_, _ = tc.Write([]byte{1}) // the client reads its session ticket before this
			}
			tc.Close()
		}
	}()
	dir := t.TempDir()
	p := &Pair{CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key")}
	rotate := func() *x509.Certificate {
		certPEM, keyPEM := issue(t, ca)
		testkit.WriteFile(t, p.CertFile, certPEM)
		testkit.WriteFile(t, p.KeyFile, keyPEM)
		return p.Current().Leaf
	}
	config := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", GetClientCertificate: p.GetClientCertificate, ClientSessionCache: p.SessionCache()}
	login := func() (resumed bool, presented *x509.Certificate) {
		c, err := tls.Dial("tcp", l.Addr().String(), config)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Read(make([]byte, 1))
		return c.ConnectionState().DidResume, <-seen
	}
	first := rotate()
	for i, want := range []struct {
		rotated, resumed bool
	}{{false, false}, {false, true}, {true, false}, {false, true}} {
		if want.rotated {
			first = rotate()
		}
		resumed, presented := login()
		if resumed != want.resumed || !presented.Equal(first) {
			t.Errorf("login %d: resumed %t, want %t; the server saw serial %x, want %x", i+1, resumed, want.resumed, presented.SerialNumber, first.SerialNumber)
		}
	}
}
