// Package brokertls keeps the embedded broker's TLS credentials in the cluster, made at run time rather than when a
// chart is rendered: a CA in a Secret, made once by whichever replica comes first, its certificate published to the
// agents in a ConfigMap, and a serving certificate issued from it in memory for the broker's names and renewed well
// before it expires. The same chart values then render the same manifests every time (helm template, Argo CD and
// Flux included), and no render can replace the CA the agents trust. The CA's key is read only from the Secret
// mounted into the controller's pod, never through the API: the controller's token may create that Secret, not
// read it.
package brokertls

import (
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Defaults of Issuer's lifetimes: a CA outlives any fleet's upgrade cycle, since every agent holds it; the serving
// certificate is short-lived, renewed in memory, which costs the agents nothing.
const (
	DefaultCAValidity      = 10 * 365 * 24 * time.Hour
	DefaultServingValidity = 90 * 24 * time.Hour
)

// CAKey is the key of the CA's certificate in the ConfigMap the agents mount (their --ca-file).
const CAKey = "ca.crt"

// DefaultCAMountWait is how long a replica waits for a CA another one made to be mounted: the kubelet fills an
// optional Secret volume at its next sync of the pod, within a minute or so.
const DefaultCAMountWait = 3 * time.Minute

// Issuer keeps the broker's CA and serving certificate (GetCertificate).
type Issuer struct {
	Client    kubernetes.Interface
	Namespace string
	// CASecret holds the CA's certificate and key (kubernetes.io/tls), mounted at CADir (optional: it may not be
	// there yet); CAConfigMap publishes its certificate.
	CASecret, CAConfigMap, CADir string
	// CAMountWait bounds the wait for CASecret to show at CADir when another replica made it (default
	// DefaultCAMountWait).
	CAMountWait time.Duration
	// Names are the broker's DNS names and IP addresses, which the serving certificate carries.
	Names []string
	// CAValidity and ServingValidity default to DefaultCAValidity and DefaultServingValidity.
	CAValidity, ServingValidity time.Duration
	Log                         logr.Logger
	// Now is the clock certificates are dated and renewed by (default time.Now).
	Now func() time.Time

	ca      *x509.Certificate
	caKey   crypto.Signer
	mu      sync.Mutex
	serving *tls.Certificate
}

// Start makes or reads the CA, publishes it, issues the first serving certificate and renews it, until ctx ends,
// once a third of its lifetime is left. It returns once the broker can serve.
func (i *Issuer) Start(ctx context.Context) error {
	if err := i.ensureCA(ctx); err != nil {
		return err
	}
	if err := i.publishCA(ctx); err != nil {
		return err
	}
	if err := i.renew(); err != nil {
		return err
	}
	go i.keepRenewed(ctx)
	return nil
}

// GetCertificate is for the broker's tls.Config: the current serving certificate.
func (i *Issuer) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.serving == nil {
		return nil, errors.New("no serving certificate issued yet")
	}
	return i.serving, nil
}

// keepRenewed renews the serving certificate once a third of its lifetime is left, looking a hundred times a
// lifetime (once a minute at most).
func (i *Issuer) keepRenewed(ctx context.Context) {
	every := min(i.servingValidity()/100, time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !i.due() {
			continue
		}
		if err := i.renew(); err != nil {
			i.Log.Error(err, "renewing the broker's certificate; tried again", "in", every)
		}
	}
}

// due: a third of the serving certificate's lifetime is left, or less.
func (i *Issuer) due() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.now().After(i.serving.Leaf.NotAfter.Add(-i.servingValidity() / 3))
}

// renew issues a serving certificate for Names from the CA. Connections made before keep theirs: a renewal drops
// no session.
func (i *Issuer) renew() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("the broker's key: %w", err)
	}
	now := i.now()
	// Dated an hour back, for nodes whose clocks lag (an edge node offline for long); never past the CA.
	template := &x509.Certificate{Subject: pkix.Name{CommonName: "lifeline-broker"}, NotBefore: now.Add(-time.Hour),
		NotAfter: minTime(now.Add(i.servingValidity()), i.ca.NotAfter), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, name := range i.Names {
		if ip := net.ParseIP(name); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, name)
		}
	}
	leaf, der, err := sign(template, key.Public(), i.ca, i.caKey)
	if err != nil {
		return fmt.Errorf("issuing the broker's certificate: %w", err)
	}
	i.mu.Lock()
	i.serving = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	i.mu.Unlock()
	i.Log.Info("the broker's certificate issued", "names", i.Names, "notAfter", leaf.NotAfter, "serial", leaf.SerialNumber.Text(16))
	return nil
}

// ensureCA reads the CA mounted at CADir; when none is, it makes one and creates CASecret with it, unless another
// replica did first, whose CA it then waits for at CADir.
func (i *Issuer) ensureCA(ctx context.Context) error {
	where := fmt.Sprintf("the broker's CA (Secret %s/%s, mounted at %s)", i.Namespace, i.CASecret, i.CADir)
	if err := i.readMountedCA(); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return wrapped(where, err)
	}
	s, certPEM, keyPEM, err := i.makeCA()
	if err != nil {
		return wrapped(where, err)
	}
	_, err = i.Client.CoreV1().Secrets(i.Namespace).Create(ctx, s, metav1.CreateOptions{})
	switch {
	case err == nil:
		i.Log.Info("made the broker's CA", "secret", i.CASecret)
		return wrapped(where, i.useCA(certPEM, keyPEM))
	case !apierrors.IsAlreadyExists(err):
		return wrapped(where, err)
	}
	i.Log.Info("another replica made the broker's CA: waiting for it to be mounted", "dir", i.CADir)
	err = wait.PollUntilContextTimeout(ctx, time.Second, cmp.Or(i.CAMountWait, DefaultCAMountWait), true, func(context.Context) (bool, error) {
		err := i.readMountedCA()
		return err == nil, ignoreNotExist(err)
	})
	return wrapped(where, err)
}

// readMountedCA reads the CA at CADir.
func (i *Issuer) readMountedCA() error {
	certPEM, err := os.ReadFile(filepath.Join(i.CADir, corev1.TLSCertKey))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(i.CADir, corev1.TLSPrivateKeyKey))
	if err != nil {
		return err
	}
	return i.useCA(certPEM, keyPEM)
}

// useCA takes a CA's certificate and key.
func (i *Issuer) useCA(certPEM, keyPEM []byte) error {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !pair.Leaf.IsCA {
		return errors.New("not a CA with a signing key")
	}
	i.ca, i.caKey = pair.Leaf, signer
	return nil
}

// wrapped is err, if any, said of what.
func wrapped(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// makeCA is a new CA, as CASecret, and its certificate and key.
func (i *Issuer) makeCA() (s *corev1.Secret, certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("the CA's key: %w", err)
	}
	now := i.now()
	template := &x509.Certificate{Subject: pkix.Name{CommonName: "lifeline-broker-ca"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(i.caValidity()), IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	_, der, err := sign(template, key.Public(), nil, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	return &corev1.Secret{ObjectMeta: i.objectMeta(i.CASecret), Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}, certPEM, keyPEM, nil
}

// publishCA writes the CA's certificate into CAConfigMap, unless it holds it already.
func (i *Issuer) publishCA(ctx context.Context) error {
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: i.ca.Raw}))
	maps := i.Client.CoreV1().ConfigMaps(i.Namespace)
	cm, err := maps.Get(ctx, i.CAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: i.objectMeta(i.CAConfigMap), Data: map[string]string{CAKey: caPEM}}
		_, err = maps.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return i.publishCA(ctx) // another replica published it meanwhile: checked as any other
		}
	case err == nil && cm.Data[CAKey] != caPEM:
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[CAKey] = caPEM
		_, err = maps.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publishing the broker's CA (ConfigMap %s/%s): %w", i.Namespace, i.CAConfigMap, err)
	}
	return nil
}

// objectMeta is the metadata of an object the Issuer makes. Nothing owns it: the trust root of every agent must not
// go with an object that may be deleted and made again (the controller's Deployment, on a change of its selector),
// so an uninstall leaves the CA behind, as cert-manager leaves its CAs.
func (i *Issuer) objectMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: i.Namespace,
		Labels: map[string]string{"app.kubernetes.io/part-of": "lifeline", "app.kubernetes.io/component": "broker"}}
}

// sign signs template for pub with parent's key (self-signed when parent is nil).
func sign(template *x509.Certificate, pub crypto.PublicKey, parent *x509.Certificate, key crypto.Signer) (*x509.Certificate, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	template.SerialNumber = serial
	if parent == nil {
		parent = template
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, pub, key)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	return leaf, der, err
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (i *Issuer) now() time.Time {
	if i.Now != nil {
		return i.Now()
	}
	return time.Now()
}

func (i *Issuer) caValidity() time.Duration {
	if i.CAValidity > 0 {
		return i.CAValidity
	}
	return DefaultCAValidity
}

func (i *Issuer) servingValidity() time.Duration {
	if i.ServingValidity > 0 {
		return i.ServingValidity
	}
	return DefaultServingValidity
}
