package broker

import (
	"container/list"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// guardedListener is the agents' TCP (or TLS) listener. Unlike mochi's own, it bounds what a client can hold
// before it has authenticated, apart from the authenticated sessions, so that clients that never log in cannot
// keep a node out: connections not yet authenticated have a budget of their own (in all and per source), where
// the oldest makes room for the newest, and one that resumes a node's TLS session leaves it for its node's own
// (resume.go); a TLS handshake not done within handshakeTimeout, or a CONNECT not done
// within connectTimeout of opening, closes the connection (mochi itself waits for the first packet forever).
// Authenticated sessions are bounded apart (promote). It also keeps accepting after a temporary Accept error
// (out of descriptors under a flood), where mochi's listener would stop for good.
type guardedListener struct {
	id, address string
	tls         *tls.Config
	limits      Limits // with defaults
	refuse      func(reason, detail string)

	listen net.Listener
	closed atomic.Bool // set under mu, so that no connection is handed to mochi once Close began
	// clients is mochi's count of the connections it serves, which its Close waits for. mochi adds to it from
	// inside the establish call, racing that wait; the listener adds first, under mu, while not closed.
	clients *sync.WaitGroup
	// ticketOwner is the node of a session ticket this broker issued, or ""; nil without certificate login.
	ticketOwner func(identity []byte) string
	peekBuf     [4096]byte // what a client sent before its accept, looked at by Serve alone

	mu       sync.Mutex
	pending  map[netip.Prefix]*list.List // connections not yet authenticated, by source, oldest first
	npending int                         // their number, at most limits.MaxUnauthenticated
	vouched  map[string]*list.List       // those resuming a node's session, by node, oldest first (resume.go)
	nvouched int                         // their number, at most vouchedPerNode a node
	sessions map[*guardedConn]string     // authenticated connections and their nodes
	nodes    map[string]int              // sessions by node: at most one but while a reconnect takes over
}

// guardedConn is one accepted connection and where it stands.
type guardedConn struct {
	net.Conn
	source netip.Prefix
	opened time.Time
	// sawConnect notes when the broker takes over the connection's deadline, which mochi does right after it
	// has read the CONNECT: a timeout before that is a CONNECT that did not come in time.
	sawConnect atomic.Bool
	// evicted: closed to make room for a newer connection, and counted as such.
	evicted atomic.Bool
	// password is the digest of the password the session logged in with; nil for a certificate or before
	// authentication. A session lasts only while its node's password stays this one.
	password atomic.Pointer[[sha256.Size]byte]

	elem *list.Element // its place in guardedListener.pending, or .vouched, while it has not authenticated; under its mu
	// vouchedFor is the node whose session the connection resumes, once its ClientHello showed the ticket; under
	// the listener's mu.
	vouchedFor string
}

// SetDeadline is mochi's: the listener sets its own deadlines on the underlying connection.
func (c *guardedConn) SetDeadline(t time.Time) error {
	c.sawConnect.Store(true)
	return c.Conn.SetDeadline(t)
}

// guardedOf is the listener's connection under conn (a TLS connection's underlying one), or nil.
func guardedOf(conn net.Conn) *guardedConn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	gc, _ := conn.(*guardedConn)
	return gc
}

// sourceOf is the source a connection's budget is counted by: its IPv4 address, or its IPv6 /64, which one
// host commonly holds whole. Addresses that do not parse share one budget.
func sourceOf(addr net.Addr) netip.Prefix {
	var ip netip.Addr
	if ta, ok := addr.(*net.TCPAddr); ok {
		ip = ta.AddrPort().Addr().Unmap()
	} else if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
		ip = ap.Addr().Unmap()
	}
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits) // the zero Prefix for an invalid address
	return p
}

func (l *guardedListener) ID() string       { return l.id }
func (l *guardedListener) Protocol() string { return "tcp" }

func (l *guardedListener) Address() string {
	if l.listen != nil {
		return l.listen.Addr().String()
	}
	return l.address
}

// Init opens the address.
func (l *guardedListener) Init(*slog.Logger) error {
	ln, err := (&net.ListenConfig{Control: deferAccept}).Listen(context.Background(), "tcp", l.address)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", l.address, err)
	}
	l.listen = ln
	l.pending, l.vouched, l.sessions, l.nodes = map[netip.Prefix]*list.List{}, map[string]*list.List{}, map[*guardedConn]string{}, map[string]int{}
	return nil
}

// Serve accepts connections until Close.
func (l *guardedListener) Serve(establish listeners.EstablishFn) {
	for {
		conn, err := l.listen.Accept()
		if l.closed.Load() {
			if conn != nil {
				_ = conn.Close()
			}
			return
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // a temporary failure (too many open files): try again
			continue
		}
		gc := &guardedConn{Conn: conn, source: sourceOf(conn.RemoteAddr()), opened: time.Now()}
		first := l.limits.ConnectTimeout // the CONNECT's deadline, or the TLS handshake's, then the CONNECT's
		if l.tls != nil {
			first = l.limits.HandshakeTimeout
		}
		_ = conn.SetDeadline(gc.opened.Add(first))
		ok := true
		if node := l.peekedTicketNode(conn); node == "" || !l.vouch(gc, node) {
			ok = l.admit(gc)
		}
		if !ok {
			_ = conn.Close()
			continue
		}
		go l.serve(gc, establish)
	}
}

// serve runs the TLS handshake, if any, and hands the connection to mochi until it ends.
func (l *guardedListener) serve(gc *guardedConn, establish listeners.EstablishFn) {
	var c net.Conn = gc
	if l.tls != nil {
		tc := tls.Server(gc, l.tls)
		if err := tc.Handshake(); err != nil {
			l.release(gc)
			l.count(gc, fmt.Errorf("TLS handshake: %w", err))
			return
		}
		if !tc.ConnectionState().DidResume && !l.unvouch(gc) {
			l.release(gc) // closed to admit another
			return
		}
		_ = gc.Conn.SetDeadline(gc.opened.Add(l.limits.ConnectTimeout))
		c = tc
	}
	if !l.handOver() {
		l.release(gc)
		return
	}
	err := establish(l.id, c)
	l.clients.Done()
	l.release(gc)
	l.count(gc, err)
}

// handOver counts a connection among mochi's clients before mochi sees it, unless the listener is closed.
func (l *guardedListener) handOver() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed.Load() {
		return false
	}
	l.clients.Add(1)
	return true
}

// count counts how a connection ended, unless it was counted when it was evicted.
func (l *guardedListener) count(gc *guardedConn, err error) {
	if gc.evicted.Load() {
		return
	}
	if reason := refusalOf(err, gc.sawConnect.Load()); reason != "" {
		l.refuse(reason, fmt.Sprintf("%s: %v", gc.RemoteAddr(), err))
	}
}

// admit adds a connection to the budget of those not yet authenticated. When its source's share or the whole
// budget is taken, it takes the place of the oldest connection of its source, or of the source holding the
// most, which is closed and counted. It fails only once the listener is closed.
func (l *guardedListener) admit(gc *guardedConn) bool {
	l.mu.Lock()
	victim, ok := l.admitLocked(gc)
	l.mu.Unlock()
	l.closeEvicted(victim, gc)
	return ok
}

// closeEvicted closes and counts a connection evicted to admit gc, if any.
func (l *guardedListener) closeEvicted(victim, gc *guardedConn) {
	if victim == nil {
		return
	}
	_ = victim.Conn.Close()
	l.refuse(RefusedPreAuthEvicted, fmt.Sprintf("%s: not authenticated after %s, closed to admit %s",
		victim.RemoteAddr(), time.Since(victim.opened).Round(time.Millisecond), gc.RemoteAddr()))
}

// admitLocked is admit, returning the victim to close; l.mu held.
func (l *guardedListener) admitLocked(gc *guardedConn) (victim *guardedConn, ok bool) {
	if l.closed.Load() {
		return nil, false
	}
	own := l.pending[gc.source]
	switch {
	case own != nil && own.Len() >= l.limits.MaxUnauthenticatedPerSource:
		victim = own.Front().Value.(*guardedConn)
	case l.npending >= l.limits.MaxUnauthenticated:
		victim = l.oldestOfLargestSource()
	}
	if victim != nil {
		victim.evicted.Store(true)
		l.unpend(victim)
	}
	if own = l.pending[gc.source]; own == nil {
		own = list.New()
		l.pending[gc.source] = own
	}
	gc.elem = own.PushBack(gc)
	l.npending++
	return victim, true
}

// oldestOfLargestSource is the oldest pending connection of the source with the most (of those, the one whose
// oldest is oldest). It scans the sources, at most MaxUnauthenticated of them; l.mu held.
func (l *guardedListener) oldestOfLargestSource() *guardedConn {
	var best *guardedConn
	bestLen := 0
	for _, q := range l.pending {
		front := q.Front().Value.(*guardedConn)
		if q.Len() > bestLen || q.Len() == bestLen && front.opened.Before(best.opened) {
			best, bestLen = front, q.Len()
		}
	}
	return best
}

// unpend takes a connection out of the pending budget, or the vouched ones; l.mu held.
func (l *guardedListener) unpend(gc *guardedConn) {
	if node := gc.vouchedFor; node != "" {
		q := l.vouched[node]
		q.Remove(gc.elem)
		gc.elem = nil
		l.nvouched--
		if q.Len() == 0 {
			delete(l.vouched, node)
		}
		return
	}
	q := l.pending[gc.source]
	q.Remove(gc.elem)
	gc.elem = nil
	l.npending--
	if q.Len() == 0 {
		delete(l.pending, gc.source)
	}
}

// errEvicted: the connection was closed to admit a newer one before it authenticated.
var errEvicted = errors.New("closed before it authenticated, to admit a newer connection")

// promote moves a connection whose CONNECT authenticated as node from the pending budget to the sessions', with
// the digest of the password it logged in with (nil for a certificate). It fails when the sessions' budget is
// full, unless node already holds a session (a reconnect, which takes that one over), or when the connection
// was evicted meanwhile. A connection of another listener is let through.
func (l *guardedListener) promote(conn net.Conn, node string, password *[sha256.Size]byte) error {
	if l == nil {
		return nil
	}
	gc := guardedOf(conn)
	if gc == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case gc.elem == nil:
		return errEvicted
	case len(l.sessions) >= l.limits.MaxConnections && l.nodes[node] == 0:
		return fmt.Errorf("already %d sessions open, the limit", len(l.sessions))
	}
	l.unpend(gc)
	l.sessions[gc] = node
	l.nodes[node]++
	gc.password.Store(password)
	return nil
}

// release forgets a connection that ended and closes it.
func (l *guardedListener) release(gc *guardedConn) {
	l.mu.Lock()
	if gc.elem != nil {
		l.unpend(gc)
	} else if node, ok := l.sessions[gc]; ok {
		delete(l.sessions, gc)
		if l.nodes[node]--; l.nodes[node] == 0 {
			delete(l.nodes, node)
		}
	}
	l.mu.Unlock()
	_ = gc.Conn.Close()
}

// open is how many connections are open, authenticated or not.
func (l *guardedListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.npending + l.nvouched + len(l.sessions)
}

// unauthenticated is how many connections are open that have not authenticated, in all and of source.
func (l *guardedListener) unauthenticated(source netip.Prefix) (all, ofSource int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.pending[source]; q != nil {
		ofSource = q.Len()
	}
	return l.npending, ofSource
}

// Close stops accepting and closes every connection, those that never authenticated included (mochi closes
// only the sessions it knows).
func (l *guardedListener) Close(closeClients listeners.CloseFn) {
	l.mu.Lock()
	first := l.closed.CompareAndSwap(false, true)
	l.mu.Unlock()
	if !first {
		return
	}
	closeClients(l.id)
	_ = l.listen.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.pending {
		closeAll(q)
	}
	for _, q := range l.vouched {
		closeAll(q)
	}
	for c := range l.sessions {
		_ = c.Conn.Close()
	}
}

// closeAll closes the connections of q.
func closeAll(q *list.List) {
	for e := q.Front(); e != nil; e = e.Next() {
		_ = e.Value.(*guardedConn).Conn.Close()
	}
}

// refusalOf names the reason to count for how a connection ended, or "" when it ended by the client's
// choice or for a reason counted elsewhere (credentials are counted at authentication).
func refusalOf(err error, sawConnect bool) string {
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		return ""
	case errors.Is(err, packets.ErrPacketTooLarge):
		return RefusedTooLarge
	case sawConnect: // the session's own end: keepalive, credentials, a takeover
		return ""
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return RefusedConnectTimeout
	default: // garbage, a first packet that is not a CONNECT, a failed TLS handshake
		return RefusedMalformed
	}
}
