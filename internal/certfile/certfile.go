// Package certfile serves a certificate from files that are replaced while the process runs: KubeEdge's edgecore
// rotates the node's client certificate (/etc/kubeedge/certs/server.crt and server.key) at 70–90 % of its
// lifetime, writing the certificate first and the key after it, so for a moment the two do not match; the kubelet
// swaps a mounted Secret's files when cert-manager or an operator renews the broker's certificate.
package certfile

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
)

// Pair is a certificate and key file pair, read at every TLS handshake (a reconnect: rare, and the files are
// small) and parsed again when either changed. A pair that does not load (a rotation half written) leaves the
// last good one in use.
type Pair struct {
	CertFile, KeyFile string

	mu        sync.Mutex // guards the fields below
	cert, key []byte     // the files' content when current was loaded
	current   *tls.Certificate
	err       error // why the files last failed to load; nil once they load
}

// Load reads the pair now, so a bad path shows at start; a missing pair is no error (there is no certificate
// yet), one that does not parse is.
func (p *Pair) Load() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refresh()
	if p.err != nil && !errors.Is(p.err, fs.ErrNotExist) {
		return p.err
	}
	return nil
}

// Current is the certificate in use, nil if none loaded yet.
func (p *Pair) Current() *tls.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refresh()
	return p.current
}

// GetClientCertificate is for tls.Config: it presents the current certificate, or none (an empty one) while no
// pair has loaded, so the broker falls back to the password.
func (p *Pair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := p.Current(); c != nil {
		return c, nil
	}
	return &tls.Certificate{}, nil
}

// GetCertificate is for a server's tls.Config: it presents the current certificate, and refuses the handshake
// while none has loaded.
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := p.Current(); c != nil {
		return c, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return nil, fmt.Errorf("no certificate: %w", p.err)
}

func (p *Pair) refresh() {
	cert, err := os.ReadFile(p.CertFile)
	if err != nil {
		p.err = fmt.Errorf("reading the certificate: %w", err)
		return
	}
	key, err := os.ReadFile(p.KeyFile)
	if err != nil {
		p.err = fmt.Errorf("reading the key: %w", err)
		return
	}
	if p.current != nil && bytes.Equal(cert, p.cert) && bytes.Equal(key, p.key) {
		return
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil { // half rotated: the next handshake tries again
		p.err = fmt.Errorf("loading the certificate %s: %w", p.CertFile, err)
		return
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			p.err = fmt.Errorf("parsing the certificate %s: %w", p.CertFile, err)
			return
		}
	}
	p.current, p.cert, p.key, p.err = &pair, cert, key, nil
}

// SessionCache is for a client's tls.Config: it keeps the TLS sessions to resume (a login by a ticket the server
// issued, which a broker under a churn of connections lets in first), each only while the certificate it began
// with is the current one, so a rotated certificate logs in by a full handshake and the server sees it.
func (p *Pair) SessionCache() tls.ClientSessionCache {
	return &sessionsOfCertificate{pair: p}
}

// sessionsOfCertificate is Pair.SessionCache.
type sessionsOfCertificate struct {
	pair *Pair

	mu       sync.Mutex
	sessions tls.ClientSessionCache
	of       *tls.Certificate // the certificate every session in sessions began with
	// began is the certificate current when each server's last handshake began (it looks its session up then):
	// a session is kept only if the certificate did not change during the handshake that made it.
	began map[string]*tls.Certificate
}

// sessionsPerCertificate bounds the sessions kept: one per server name, and a client dials one broker.
const sessionsPerCertificate = 4

func (s *sessionsOfCertificate) Get(key string) (*tls.ClientSessionState, bool) {
	current := s.pair.Current()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.began == nil || len(s.began) >= sessionsPerCertificate {
		s.began = map[string]*tls.Certificate{}
	}
	s.began[key] = current
	if s.sessions == nil || current != s.of {
		return nil, false
	}
	return s.sessions.Get(key)
}

func (s *sessionsOfCertificate) Put(key string, cs *tls.ClientSessionState) {
	current := s.pair.Current()
	s.mu.Lock()
	defer s.mu.Unlock()
	if began, ok := s.began[key]; !ok || began != current {
		return // rotated during the handshake: which certificate the session began with is not known
	}
	if s.sessions == nil || current != s.of {
		s.sessions, s.of = tls.NewLRUClientSessionCache(sessionsPerCertificate), current
	}
	s.sessions.Put(key, cs)
}
