package brokertls

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The controller's embedded broker serving the issuer's certificate, as lifeline-controller wires them, with the
// agents' own publisher on the other side: when the certificate is renewed, the agents connected before keep their
// sessions (no second attempt), and an agent that connects afterwards is served the renewed certificate, which it
// checks against the CA it read from the published ConfigMap.
func TestAgentsKeepTheirSessionsThroughARenewal(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	i := issuer(t, ns)
	i.Names = []string{"127.0.0.1"}
	i.ServingValidity = 3 * time.Second
	if err := i.Start(ctx); err != nil {
		t.Fatal(err)
	}
	credentials := t.TempDir()
	for _, node := range []string{"edge1", "edge2"} {
		if err := os.WriteFile(filepath.Join(credentials, node), []byte("pw-"+node+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tracker, err := liveness.NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	addr := harness.FreeAddr(t)
	b, err := broker.Start(broker.Config{Address: addr, Cluster: "c", CredentialsDir: credentials, Tracker: tracker,
		TLS: &tls.Config{GetCertificate: i.GetCertificate, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	trust := &tls.Config{RootCAs: publishedCA(t, ns), MinVersion: tls.VersionTLS12}
	agent := func(node string) *publisher.Publisher {
		state := t.TempDir()
		j, err := journal.Open(filepath.Join(state, "journal.db"), 10)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		p := publisher.New(publisher.Config{Broker: "ssl://" + addr, Username: node, Password: "pw-" + node, Cluster: "c",
			Node: node, StateDir: state, TLS: trust, RetryInterval: 100 * time.Millisecond}, j)
		testkit.Background(t, ctx, p.Run)
		return p
	}
	served := func() []byte {
		conn, err := tls.Dial("tcp", addr, trust)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}

	before := agent("edge1")
	testkit.Until(t, 5*time.Second, "the first agent connected", before.Connected)
	first := served()
	testkit.Until(t, 10*time.Second, "the certificate renewed", func() bool { return !bytes.Equal(served(), first) })
	after := agent("edge2")
	testkit.Until(t, 5*time.Second, "the second agent connected, after the renewal", after.Connected)
	testkit.Sample(t, 50*time.Millisecond, time.Second, func(context.Context) error {
		if !before.Connected() || before.Attempts() != 1 {
			return fmt.Errorf("the agent connected before the renewal: connected %v after %d attempts", before.Connected(), before.Attempts())
		}
		return nil
	})
}
