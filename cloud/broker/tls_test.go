package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// selfSignedServer returns a server certificate for 127.0.0.1 and the pool that trusts it.
func selfSignedServer(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	ca := testkit.NewCA(t, "lifeline-broker CA")
	cert := ca.Issue(t, testkit.CertOptions{CommonName: "lifeline-broker", IPs: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return cert, ca.Pool()
}

// The agent's publisher and the controller's broker over TLS: a node that trusts the broker's CA and knows its
// password is heard; one that does not trust the certificate never connects.
func TestAgentReachesTheBrokerOverTLS(t *testing.T) {
	cert, pool := selfSignedServer(t)
	r := startRig(t, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	addr := r.addr

	agent := func(trust *x509.CertPool) (*publisher.Publisher, context.CancelFunc) {
		state := t.TempDir()
		j, err := journal.Open(filepath.Join(state, "journal.db"), 10)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		p := publisher.New(publisher.Config{Broker: "ssl://" + addr, Username: "edge1", Password: "pw1", Cluster: "c", Node: "edge1",
			StateDir: state, TLS: &tls.Config{RootCAs: trust, MinVersion: tls.VersionTLS12}, RetryInterval: 100 * time.Millisecond}, j)
		ctx, cancel := context.WithCancel(context.Background())
		go p.Run(ctx)
		return p, cancel
	}
	stranger, stop := agent(x509.NewCertPool())
	// Its first attempt ended: connected, or failed (the publisher tries again only after a failure).
	testkit.Until(t, 5*time.Second, "the distrustful agent's first attempt ended", func() bool {
		return stranger.Connected() || stranger.Attempts() >= 2
	})
	stop()
	if stranger.Connected() || r.count("lifeline_liveness_messages_total", "birth") != 0 {
		t.Fatal("an agent that does not trust the broker's certificate connected")
	}
	trusting, stop := agent(pool)
	defer stop()
	testkit.Until(t, 5*time.Second, "the trusting agent's birth over TLS", func() bool {
		return trusting.Connected() && r.count("lifeline_liveness_messages_total", "birth") == 1
	})
}
