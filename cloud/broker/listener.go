package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// guardedListener is the agents' TCP (or TLS) listener. Unlike mochi's own, it bounds what a client can hold
// before it has authenticated: at most maxConns connections are open at once (one more is closed at accept),
// and a connection that has not sent its CONNECT within connectTimeout of opening is closed; mochi itself waits
// for the first packet forever. It also keeps accepting after a temporary Accept error (out of descriptors
// under a flood), where mochi's listener would stop for good.
type guardedListener struct {
	id, address    string
	tls            *tls.Config
	maxConns       int
	connectTimeout time.Duration
	refuse         func(reason, detail string)

	listen net.Listener
	closed atomic.Bool
	mu     sync.Mutex
	conns  map[*guardedConn]struct{} // open connections, at most maxConns
}

// guardedConn notes when the broker takes over the connection's deadline, which mochi does right after it
// has read the CONNECT: a timeout before that is a CONNECT that did not come in time.
type guardedConn struct {
	net.Conn
	sawConnect atomic.Bool
}

func (c *guardedConn) SetDeadline(t time.Time) error {
	c.sawConnect.Store(true)
	return c.Conn.SetDeadline(t)
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
	ln, err := net.Listen("tcp", l.address)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", l.address, err)
	}
	l.listen, l.conns = ln, map[*guardedConn]struct{}{}
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
		gc := &guardedConn{Conn: conn}
		if !l.admit(gc) {
			_ = conn.Close()
			l.refuse(RefusedConnections, fmt.Sprintf("%s: already %d connections open", conn.RemoteAddr(), l.maxConns))
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(l.connectTimeout)) // TLS handshake and CONNECT included
		var c net.Conn = gc
		if l.tls != nil {
			c = tls.Server(gc, l.tls)
		}
		go func() {
			err := establish(l.id, c)
			l.release(gc)
			if reason := refusalOf(err, gc.sawConnect.Load()); reason != "" {
				l.refuse(reason, fmt.Sprintf("%s: %v", conn.RemoteAddr(), err))
			}
		}()
	}
}

func (l *guardedListener) admit(c *guardedConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) >= l.maxConns || l.closed.Load() {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *guardedListener) release(c *guardedConn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
}

// open is how many connections are open, authenticated or not.
func (l *guardedListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Close stops accepting and closes every connection, those that never authenticated included (mochi closes
// only the sessions it knows).
func (l *guardedListener) Close(closeClients listeners.CloseFn) {
	if !l.closed.CompareAndSwap(false, true) {
		return
	}
	closeClients(l.id)
	_ = l.listen.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
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
