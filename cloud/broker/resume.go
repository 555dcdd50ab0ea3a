package broker

import (
	"container/list"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
)

// An agent that logged in by certificate before resumes its TLS session with a ticket that only this broker can
// have issued, and only to a client whose certificate verified as a node's. Such a connection is vouched for as
// soon as its ClientHello shows the ticket (at its accept, when the client sent it already), and leaves the budget of connections not yet authenticated: there a
// churn of connections from the same source address, which is every agent's when a NodePort Service
// (externalTrafficPolicy Cluster) hides them behind one node's address, would close it before its login ends.
// The CONNECT still checks everything (the certificate, which the session carries, revocation, the Node).

// ticketNodePrefix marks, in a session ticket's extra data, the node whose verified certificate the session
// began with.
const ticketNodePrefix = "lifeline-node:"

// vouchedPerNode bounds the vouched connections of one node not yet authenticated: its agent's login and a retry.
// A ticket seen on the wire can be replayed (its identity travels in the clear, though its key does not), so a
// newer one closes the node's oldest, and a replay costs only the node whose ticket it is.
const vouchedPerNode = 2

// resumable makes base issue session tickets that name the node of a verified client certificate (nodeOf: "" for
// none) and vouch, through l, for a connection that resumes one. Its ticket keys live as long as the broker: after
// a restart every agent logs in once by a full handshake again.
func (l *guardedListener) resumable(base *tls.Config, nodeOf func(chain []*x509.Certificate) string) (*tls.Config, error) {
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("a session ticket key: %w", err)
	}
	cfg := base.Clone()
	cfg.SetSessionTicketKeys([][32]byte{key})
	l.ticketOwner = func(identity []byte) string {
		if ss, err := cfg.DecryptTicket(identity, tls.ConnectionState{}); err == nil && ss != nil {
			return ticketNode(ss)
		}
		return ""
	}
	cfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		if node := nodeOf(cs.PeerCertificates); node != "" {
			ss.Extra = append(ss.Extra, []byte(ticketNodePrefix+node))
		}
		return cfg.EncryptTicket(cs, ss)
	}
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		gc := guardedOf(hello.Conn)
		if gc == nil {
			return nil, nil
		}
		own := cfg.Clone()
		own.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
			ss, err := own.DecryptTicket(identity, cs)
			if ss != nil {
				if node := ticketNode(ss); node != "" {
					l.vouch(gc, node)
				}
			}
			return ss, err
		}
		return own, nil
	}
	return cfg, nil
}

// ticketNode is the node a session ticket names, or "".
func ticketNode(ss *tls.SessionState) string {
	for _, e := range ss.Extra {
		if node, ok := strings.CutPrefix(string(e), ticketNodePrefix); ok {
			return node
		}
	}
	return ""
}

// peekedTicketNode is the node of the session ticket that the ClientHello conn's client sent already offers first,
// when this broker issued it; "" when it has sent none yet, or offers none. Looking at the socket before the
// handshake's goroutine reads it matters: under a churn from its source a connection not yet vouched for is
// closed within milliseconds. Only the first ticket is tried (an agent offers one), so a hello of many costs one
// decryption.
func (l *guardedListener) peekedTicketNode(conn net.Conn) string {
	if l.ticketOwner == nil {
		return ""
	}
	if tickets := offeredTickets(l.peekBuf[:peek(conn, l.peekBuf[:])]); len(tickets) > 0 {
		return l.ticketOwner(tickets[0])
	}
	return ""
}

// vouch moves a connection not yet authenticated that resumes node's session, just accepted or pending, into
// node's vouched ones, and tells whether it did (not for one closed meanwhile); beyond vouchedPerNode, node's
// oldest is closed and counted as evicted.
func (l *guardedListener) vouch(gc *guardedConn, node string) bool {
	l.mu.Lock()
	if l.closed.Load() || gc.evicted.Load() || gc.vouchedFor != "" {
		l.mu.Unlock()
		return false
	}
	if gc.elem != nil {
		l.unpend(gc)
	}
	q := l.vouched[node]
	if q == nil {
		q = list.New()
		l.vouched[node] = q
	}
	gc.vouchedFor, gc.elem = node, q.PushBack(gc)
	l.nvouched++
	var victim *guardedConn
	if q.Len() > vouchedPerNode {
		victim = q.Front().Value.(*guardedConn)
		victim.evicted.Store(true)
		l.unpend(victim)
	}
	l.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
		l.refuse(RefusedPreAuthEvicted, fmt.Sprintf("%s: resuming node %s's session, closed to admit a newer resumption of it from %s",
			victim.RemoteAddr(), node, gc.RemoteAddr()))
	}
	return true
}
