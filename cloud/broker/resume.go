package broker

import (
	"container/list"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// An agent that logged in by certificate before resumes its TLS session. The broker keeps the sessions it may
// resume itself, each under a random ticket, and only those that began with a certificate that verified as a
// node's: a connection whose ClientHello offers such a ticket, still valid, leaves the budget of connections not
// yet authenticated for its node's own, where a churn of connections from the same source address (every
// agent's, behind a NodePort Service's one node address) cannot close it before its login ends. A ticket travels
// in the clear, so it proves nothing before the handshake checks the session's key: a node's own budget admits
// at most vouchedPerNode connections and closes none to admit another (a replayed ticket takes only its node's
// place in the line, and the agent's connection waits in its source's budget as it would without a ticket), and a
// connection vouched for whose handshake then does not resume goes back to its source's budget. The CONNECT
// still checks everything (the session's certificate, revocation, the Node).

// vouchedPerNode bounds the connections vouched for as one node's that have not authenticated yet: its agent's
// login and a retry.
const vouchedPerNode = 2

// sessionsPerNode bounds the sessions kept for one node (its latest), and sessionLifetime how long one may be
// resumed: a day, well under crypto/tls's seven.
const (
	sessionsPerNode = 2
	sessionLifetime = 24 * time.Hour
)

// storedSession is a session the broker may resume: the node and certificate it began with, and when.
type storedSession struct {
	ticket   string
	node     string
	serial   *big.Int
	notAfter time.Time
	issued   time.Time
	state    []byte // tls.SessionState.Bytes
}

// sessionStore holds the sessions the broker may resume, by ticket, at most sessionsPerNode a node and
// maxSessions in all (the oldest go first).
type sessionStore struct {
	clock       clock.PassiveClock
	revoked     func(serial *big.Int) bool
	maxSessions int

	mu       sync.Mutex
	byTicket map[string]*list.Element // of order
	byNode   map[string]int
	order    *list.List // *storedSession, oldest first
}

func newSessionStore(c clock.PassiveClock, revoked func(*big.Int) bool, maxSessions int) *sessionStore {
	return &sessionStore{clock: c, revoked: revoked, maxSessions: maxSessions, byTicket: map[string]*list.Element{},
		byNode: map[string]int{}, order: list.New()}
}

// keep stores a session of node under a new ticket, which it returns.
func (s *sessionStore) keep(node string, leaf *x509.Certificate, state []byte) (string, error) {
	ticket := make([]byte, 16)
	if _, err := rand.Read(ticket); err != nil {
		return "", fmt.Errorf("a session ticket: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.byNode[node] >= sessionsPerNode || s.order.Len() >= s.maxSessions {
		s.dropOldest(node)
	}
	stored := &storedSession{ticket: string(ticket), node: node, serial: leaf.SerialNumber, notAfter: leaf.NotAfter,
		issued: s.clock.Now(), state: state}
	s.byTicket[stored.ticket] = s.order.PushBack(stored)
	s.byNode[node]++
	return stored.ticket, nil
}

// dropOldest drops node's oldest session when it holds sessionsPerNode, else the oldest of all; s.mu held.
func (s *sessionStore) dropOldest(node string) {
	e := s.order.Front()
	if s.byNode[node] >= sessionsPerNode {
		for e.Value.(*storedSession).node != node {
			e = e.Next()
		}
	}
	s.drop(e)
}

// drop forgets a session; s.mu held.
func (s *sessionStore) drop(e *list.Element) {
	stored := s.order.Remove(e).(*storedSession)
	delete(s.byTicket, stored.ticket)
	if s.byNode[stored.node]--; s.byNode[stored.node] == 0 {
		delete(s.byNode, stored.node)
	}
}

// resumable is the session of ticket while it may be resumed: within sessionLifetime, its certificate neither
// expired nor revoked. Nil otherwise, and a session that may no longer be resumed is forgotten.
func (s *sessionStore) resumable(ticket []byte) *storedSession {
	s.mu.Lock()
	e, ok := s.byTicket[string(ticket)]
	if !ok {
		s.mu.Unlock()
		return nil
	}
	stored, now := e.Value.(*storedSession), s.clock.Now()
	if now.Sub(stored.issued) > sessionLifetime || now.After(stored.notAfter) {
		s.drop(e)
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	if s.revoked(stored.serial) { // reads the revocation list: outside the lock
		s.forget(ticket)
		return nil
	}
	return stored
}

// forget drops the session of ticket, if kept.
func (s *sessionStore) forget(ticket []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byTicket[string(ticket)]; ok {
		s.drop(e)
	}
}

// resumable makes base resume the sessions of store, and only those, and vouch, through l, for a connection that
// offers one. A certificate that does not verify as a node's (nodeOf: "") gets a ticket that resumes nothing.
func (l *guardedListener) resumable(base *tls.Config, store *sessionStore, nodeOf func(chain []*x509.Certificate) string) *tls.Config {
	l.ticketOwner = func(ticket []byte) string {
		if stored := store.resumable(ticket); stored != nil {
			return stored.node
		}
		return ""
	}
	cfg := base.Clone()
	cfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		node := nodeOf(cs.PeerCertificates)
		if node == "" {
			unknown := make([]byte, 16)
			_, err := rand.Read(unknown)
			return unknown, err
		}
		state, err := ss.Bytes()
		if err != nil {
			return nil, err
		}
		ticket, err := store.keep(node, cs.PeerCertificates[0], state)
		return []byte(ticket), err
	}
	// A connection of the listener resumes with a configuration of its own, which vouches for it.
	unwrapFor := func(gc *guardedConn) func([]byte, tls.ConnectionState) (*tls.SessionState, error) {
		return func(ticket []byte, _ tls.ConnectionState) (*tls.SessionState, error) {
			stored := store.resumable(ticket)
			if stored == nil {
				return nil, nil
			}
			if gc != nil {
				l.vouch(gc, stored.node)
			}
			return tls.ParseSessionState(stored.state)
		}
	}
	cfg.UnwrapSession = unwrapFor(nil)
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		gc := guardedOf(hello.Conn)
		if gc == nil {
			return nil, nil
		}
		own := cfg.Clone()
		own.UnwrapSession = unwrapFor(gc)
		return own, nil
	}
	return cfg
}

// peekedTicketNode is the node of the session that the ClientHello conn's client sent already offers first to
// resume, when the broker may resume it; "" when it has sent none yet, or offers none. Looking at the socket
// before the handshake's goroutine reads it matters: under a churn from its source a connection not yet vouched
// for is closed within milliseconds. Only the first ticket is looked up (an agent offers one).
func (l *guardedListener) peekedTicketNode(conn net.Conn) string {
	if l.ticketOwner == nil {
		return ""
	}
	if tickets := offeredTickets(l.peekBuf[:peek(conn, l.peekBuf[:])]); len(tickets) > 0 {
		return l.ticketOwner(tickets[0])
	}
	return ""
}

// vouch moves a connection not yet authenticated that offers to resume node's session, just accepted or pending,
// into node's own budget, and tells whether it did: not when that budget is full (vouchedPerNode), nor for a
// connection closed or vouched for meanwhile.
func (l *guardedListener) vouch(gc *guardedConn, node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.vouched[node]
	if l.closed.Load() || gc.evicted.Load() || gc.vouchedFor != "" || (q != nil && q.Len() >= vouchedPerNode) {
		return false
	}
	if gc.elem != nil {
		l.unpend(gc)
	}
	if q == nil {
		q = list.New()
		l.vouched[node] = q
	}
	gc.vouchedFor, gc.elem = node, q.PushBack(gc)
	l.nvouched++
	return true
}

// unvouch puts a connection vouched for whose handshake did not resume the session back in its source's budget,
// which may close another connection (the victim is closed and counted here). It tells whether the connection is
// still open.
func (l *guardedListener) unvouch(gc *guardedConn) bool {
	l.mu.Lock()
	if gc.vouchedFor == "" || gc.elem == nil {
		open := gc.elem != nil
		l.mu.Unlock()
		return open
	}
	l.unpend(gc)
	gc.vouchedFor = ""
	victim, ok := l.admitLocked(gc)
	l.mu.Unlock()
	l.closeEvicted(victim, gc)
	return ok
}
