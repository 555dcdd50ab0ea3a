package brokertls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var kube kubernetes.Interface

func TestMain(m *testing.M) {
	os.Exit(harness.RunTests(m, harness.ControlPlaneOptions{WithoutScheduler: true}, func(cp *harness.ControlPlane) error {
		var err error
		kube, err = kubernetes.NewForConfig(cp.Config)
		return err
	}))
}

// namespace makes a namespace of its own for a test.
func namespace(t *testing.T) string {
	t.Helper()
	if kube == nil {
		t.Skip("needs the control plane (run without -short)")
	}
	name := strings.ToLower(strings.NewReplacer("_", "-").Replace(t.Name()))
	name = name[:min(len(name), 50)]
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// issuer is a replica's Issuer, the CA Secret mounted at a directory of its own (empty until mount fills it).
func issuer(t *testing.T, ns string) *Issuer {
	return &Issuer{Client: kube, Namespace: ns, CASecret: "lifeline-broker-ca-key", CAConfigMap: "lifeline-broker-ca",
		CADir: t.TempDir(), Names: []string{"lifeline-broker.lifeline-system.svc", "10.0.0.7"}, Log: logr.Discard()}
}

// mount does what the kubelet does for a replica's optional volume of the CA Secret: once the Secret is there, its
// files appear in dir.
func mount(t *testing.T, ns, dir string) {
	t.Helper()
	testkit.UntilErr(t, 30*time.Second, "the CA Secret made", func(ctx context.Context) (bool, error) {
		s, err := kube.CoreV1().Secrets(ns).Get(ctx, "lifeline-broker-ca-key", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for name, data := range s.Data {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// publishedCA is the CA pool the agents read: the ConfigMap's ca.crt.
func publishedCA(t *testing.T, ns string) *x509.CertPool {
	t.Helper()
	cm, err := kube.CoreV1().ConfigMaps(ns).Get(context.Background(), "lifeline-broker-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(cm.Data[CAKey])) {
		t.Fatalf("the ConfigMap's %s holds no certificate: %q", CAKey, cm.Data[CAKey])
	}
	return pool
}

// Two replicas starting at once make one CA between them, published once: the one whose Secret the API server
// took first uses its own, the other the one mounted into it once there (it may not read the Secret through the
// API). Each one's certificate is valid, by the published CA, for every name of the broker, DNS name and IP address
// alike. A replica started later (a restart, an upgrade) keeps that CA.
func TestReplicasShareOneCAThatIsPublishedToTheAgents(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	issuers := []*Issuer{issuer(t, ns), issuer(t, ns)}
	var wg sync.WaitGroup
	errs := make([]error, len(issuers))
	for n, i := range issuers {
		wg.Add(1)
		go func() { defer wg.Done(); errs[n] = i.Start(ctx) }()
	}
	for _, i := range issuers {
		mount(t, ns, i.CADir)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	later := issuer(t, ns)
	mount(t, ns, later.CADir)
	if err := later.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pool := publishedCA(t, ns)
	for n, i := range append(issuers, later) {
		if !i.ca.Equal(issuers[0].ca) {
			t.Errorf("replica %d has a CA of its own", n)
		}
		cert, err := i.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range i.Names {
			if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
				t.Errorf("replica %d's certificate for %s: %v", n, name, err)
			}
		}
	}
}

// The serving certificate is renewed once a third of its lifetime is left; a connection made before keeps working
// across the renewal (no session is dropped), and a new one gets the new certificate, valid by the CA the agents
// already hold.
func TestARenewalDropsNoConnectionAndServesTheNewCertificate(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	i := issuer(t, ns)
	i.ServingValidity = 3 * time.Second
	if err := i.Start(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: i.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go echo(l)
	client := &tls.Config{RootCAs: publishedCA(t, ns), ServerName: "10.0.0.7"}
	dial := func() *tls.Conn {
		c, err := tls.Dial("tcp", l.Addr().String(), client)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	before := dial()
	defer before.Close()
	first := before.ConnectionState().PeerCertificates[0].SerialNumber
	var renewed *x509.Certificate
	testkit.Until(t, 10*time.Second, "a renewed certificate served", func() bool {
		c := dial()
		defer c.Close()
		renewed = c.ConnectionState().PeerCertificates[0]
		return renewed.SerialNumber.Cmp(first) != 0
	})
	if _, err := fmt.Fprintln(before, "still there"); err != nil {
		t.Fatalf("the connection made before the renewal: %v", err)
	}
	line := make([]byte, len("still there\n"))
	if _, err := io.ReadFull(before, line); err != nil || string(line) != "still there\n" {
		t.Errorf("the connection made before the renewal echoed %q (%v)", line, err)
	}
}

// echo answers each connection with what it reads.
func echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	}
}

// A Secret under the CA's name that holds no CA (someone else's certificate) is refused, by name, rather than
// used to sign the broker's certificate.
func TestASecretThatHoldsNoCAIsRefused(t *testing.T) {
	ns := namespace(t)
	certPEM, keyPEM := testkit.NewCA(t, "someone").IssuePEM(t, testkit.CertOptions{CommonName: "someone-else"})
	_, err := kube.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "lifeline-broker-ca-key"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i := issuer(t, ns)
	mount(t, ns, i.CADir)
	err = i.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "lifeline-broker-ca-key") {
		t.Errorf("started with a Secret that holds no CA: %v", err)
	}
}
