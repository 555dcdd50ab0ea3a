package broker

import (
	"crypto/tls"
	"net"
	"testing"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// firstFlight records what a client writes first and sends it nowhere.
type firstFlight struct {
	net.Conn
	written []byte
}

func (f *firstFlight) Write(p []byte) (int, error) {
	if f.written == nil {
		f.written = append([]byte{}, p...)
	}
	return f.Conn.Write(p)
}

// resumingHello is the first flight of a Go client that resumes the session of a node certificate's login to r's
// broker (with cache), and of one that has none to resume.
func resumingHello(t *testing.T, r *certRig) (resuming, fresh []byte) {
	t.Helper()
	cert := r.ca.Issue(t, nodeCert(r.ca, "edge1"))
	cache := tls.NewLRUClientSessionCache(1)
	c, err := r.loginOver(lifelinev1.AgentClientID("edge1"), &cert, cache, "127.0.0.1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Disconnect(0)
	for _, cache := range []tls.ClientSessionCache{cache, nil} {
		raw, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		rec := &firstFlight{Conn: raw}
		tc := tls.Client(rec, &tls.Config{RootCAs: r.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12, ClientSessionCache: cache,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		tc.Close()
		if cache != nil {
			resuming = rec.written
		} else {
			fresh = rec.written
		}
	}
	return resuming, fresh
}

// The ticket a resuming ClientHello offers is found in it, and is one this broker issued to the node; a fresh
// ClientHello, and every hello cut short, offers none.
func TestOfferedTicketsAreFoundInAClientHello(t *testing.T) {
	r := startCertRigWith(t, nil, Limits{})
	resuming, fresh := resumingHello(t, r)
	tickets := offeredTickets(resuming)
	if len(tickets) != 1 {
		t.Fatalf("%d tickets offered by a resuming ClientHello of %d bytes, want 1", len(tickets), len(resuming))
	}
	if node := r.broker.listener.ticketOwner(tickets[0]); node != "edge1" {
		t.Errorf("the offered ticket is node %q's, want edge1", node)
	}
	if got := offeredTickets(fresh); len(got) != 0 {
		t.Errorf("a ClientHello with no session offers %d tickets", len(got))
	}
	for n := range len(resuming) {
		if got := offeredTickets(resuming[:n]); len(got) != 0 {
			t.Fatalf("the first %d of %d bytes offer %d tickets, want none: the hello is cut short", n, len(resuming), len(got))
		}
	}
	if node := r.broker.listener.ticketOwner([]byte("not a ticket")); node != "" {
		t.Errorf("a made-up ticket is node %q's", node)
	}
}

// No input makes the ClientHello reader panic or hand out an identity that is not inside its input.
func FuzzOfferedTickets(f *testing.F) {
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, id := range offeredTickets(b) {
			if len(id) > len(b) {
				t.Fatalf("an identity of %d bytes out of %d", len(id), len(b))
			}
		}
	})
}
