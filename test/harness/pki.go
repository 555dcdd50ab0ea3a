package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files of a throw-away certificate authority: one CA signs the API server's serving certificate
// and every client certificate, so a single --client-ca-file authenticates all components.
type pki struct {
	dir          string
	caCert       string
	caKey        string
	servingCert  string
	servingKey   string
	saPrivateKey string
	saPublicKey  string

	ca     *x509.Certificate
	caPriv *ecdsa.PrivateKey
}

// clientCredential is a client certificate and key on disk for one identity.
type clientCredential struct {
	cert, key string
}

// newPKI writes a CA, a serving certificate valid for the given IPs and DNS names, and a service-account key pair
// into dir.
func newPKI(dir string, ips []net.IP, dnsNames []string) (*pki, error) {
	p := &pki{
		dir:          dir,
		caCert:       filepath.Join(dir, "ca.crt"),
		caKey:        filepath.Join(dir, "ca.key"),
		servingCert:  filepath.Join(dir, "apiserver.crt"),
		servingKey:   filepath.Join(dir, "apiserver.key"),
		saPrivateKey: filepath.Join(dir, "sa.key"),
		saPublicKey:  filepath.Join(dir, "sa.pub"),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pki dir: %w", err)
	}
	caPriv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lifeline-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caPriv.PublicKey, caPriv)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	if p.ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	p.caPriv = caPriv
	if err := writeCertAndKey(p.caCert, p.caKey, caDER, caPriv); err != nil {
		return nil, err
	}
	if err := p.sign(p.servingCert, p.servingKey, pkix.Name{CommonName: "kube-apiserver"}, ips, dnsNames,
		x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if err := writeServiceAccountKeys(p.saPrivateKey, p.saPublicKey); err != nil {
		return nil, err
	}
	return p, nil
}

// clientCert signs a client certificate for user name in the given groups.
func (p *pki) clientCert(name string, groups ...string) (clientCredential, error) {
	c := clientCredential{
		cert: filepath.Join(p.dir, name+".crt"),
		key:  filepath.Join(p.dir, name+".key"),
	}
	err := p.sign(c.cert, c.key, pkix.Name{CommonName: name, Organization: groups}, nil, nil, x509.ExtKeyUsageClientAuth)
	return c, err
}

// signServing signs a server certificate for name at the given addresses.
func (p *pki) signServing(name string, ips []net.IP, dnsNames []string) (clientCredential, error) {
	c := clientCredential{
		cert: filepath.Join(p.dir, name+".crt"),
		key:  filepath.Join(p.dir, name+".key"),
	}
	err := p.sign(c.cert, c.key, pkix.Name{CommonName: name}, ips, dnsNames, x509.ExtKeyUsageServerAuth)
	return c, err
}

var serial = time.Now().UnixNano()

func (p *pki) sign(certPath, keyPath string, subject pkix.Name, ips []net.IP, dnsNames []string,
	usage x509.ExtKeyUsage) error {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating key for %s: %w", subject.CommonName, err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &priv.PublicKey, p.caPriv)
	if err != nil {
		return fmt.Errorf("signing certificate for %s: %w", subject.CommonName, err)
	}
	return writeCertAndKey(certPath, keyPath, der, priv)
}

func writeCertAndKey(certPath, keyPath string, der []byte, priv *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", keyPath, err)
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", keyDER)
}

// writeServiceAccountKeys writes the RSA pair the API server signs service-account tokens with and the token
// controller of kube-controller-manager uses.
func writeServiceAccountKeys(privPath, pubPath string) error {
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		return fmt.Errorf("encoding service-account public key: %w", err)
	}
	if err := writePEM(privPath, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(priv)); err != nil {
		return err
	}
	return writePEM(pubPath, "PUBLIC KEY", pubDER)
}

func writePEM(path, blockType string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
