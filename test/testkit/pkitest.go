package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"testing"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid from an hour ago for a year.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key}
}

// Pool trusts the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// PEM is the CA's certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// CertOptions shape an issued certificate. A nil Serial is a random one.
type CertOptions struct {
	CommonName          string
	Organization        []string
	NotBefore, NotAfter time.Time
	ExtKeyUsage         []x509.ExtKeyUsage
	Serial              *big.Int
	IPs                 []net.IP // for a server's certificate
}

// IssuePEM signs a certificate and returns it and its new key in PEM, as KubeEdge writes server.crt and
// server.key.
func (ca *CA) IssuePEM(t testing.TB, o CertOptions) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	serial := o.Serial
	if serial == nil {
		var err error
		if serial, err = rand.Int(rand.Reader, big.NewInt(1<<62)); err != nil {
			t.Fatal(err)
		}
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: o.CommonName, Organization: o.Organization},
		NotBefore: o.NotBefore, NotAfter: o.NotAfter, ExtKeyUsage: o.ExtKeyUsage, IPAddresses: o.IPs,
		KeyUsage: x509.KeyUsageKeyEncipherment | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// Issue signs a certificate and returns it with its key.
func (ca *CA) Issue(t testing.TB, o CertOptions) tls.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.IssuePEM(t, o)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// WriteFile writes data to path, failing the test on error.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// CRL is a certificate revocation list the CA signs (DER), revoking serials, as `openssl ca -gencrl` makes one.
func (ca *CA) CRL(t testing.TB, serials ...*big.Int) []byte {
	t.Helper()
	entries := make([]x509.RevocationListEntry, 0, len(serials))
	for _, s := range serials {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now().Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now().Add(-time.Hour),
		NextUpdate: time.Now().Add(time.Hour), RevokedCertificateEntries: entries}, ca.Cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
