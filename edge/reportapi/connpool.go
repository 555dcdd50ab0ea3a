package reportapi

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// connPool holds the connections of the report API's listeners, at most max at once, so that whatever any
// process of the node opens costs the agent a bounded amount of memory. When it is full, a new connection takes
// the place of the oldest one that is not being answered (idle, or still sending its request): a flood of
// connections that never finish a request then churns among its own, while a worker's report, which follows its
// connection within a millisecond, is answered. Only when every connection is being answered does a new one
// wait, in the kernel's backlog.
type connPool struct {
	max   int
	mu    sync.Mutex
	conns map[*pooledConn]struct{}
	freed chan struct{} // a connection closed
}

func newConnPool(max int) *connPool {
	return &connPool{max: max, conns: make(map[*pooledConn]struct{}, max), freed: make(chan struct{}, 1)}
}

// listener is ln with each connection it accepts held in the pool.
func (p *connPool) listener(ln net.Listener) net.Listener {
	return &pooledListener{Listener: ln, pool: p, closed: make(chan struct{})}
}

// admit holds c in the pool, in the place of the oldest connection not being answered when the pool is full,
// or after one closes when every one is being answered; nil when closed ends first.
func (p *connPool) admit(c net.Conn, closed <-chan struct{}) *pooledConn {
	pc := &pooledConn{Conn: c, pool: p, since: time.Now()}
	for {
		p.mu.Lock()
		if len(p.conns) < p.max {
			p.conns[pc] = struct{}{}
			p.mu.Unlock()
			return pc
		}
		victim := p.oldestWaiting()
		if victim != nil {
			delete(p.conns, victim)
		}
		p.mu.Unlock()
		if victim != nil {
			_ = victim.Conn.Close()
			continue
		}
		select {
		case <-p.freed:
		case <-closed:
			_ = c.Close()
			return nil
		}
	}
}

// oldestWaiting is the connection, not being answered, that has waited longest since it opened or was last
// answered; nil when every one is being answered. Called with mu held.
func (p *connPool) oldestWaiting() *pooledConn {
	var oldest *pooledConn
	for c := range p.conns {
		if !c.answering && (oldest == nil || c.since.Before(oldest.since)) {
			oldest = c
		}
	}
	return oldest
}

// release lets c's place go.
func (p *connPool) release(c *pooledConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	select {
	case p.freed <- struct{}{}:
	default:
	}
}

// pooledListener accepts connections into its pool.
type pooledListener struct {
	net.Listener
	pool      *connPool
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *pooledListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if pc := l.pool.admit(c, l.closed); pc != nil {
		return pc, nil
	}
	return nil, net.ErrClosed
}

// Close ends an Accept waiting for a place, as well as one waiting for a connection.
func (l *pooledListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// pooledConn is a connection held in a pool; answering and since are guarded by the pool's mu.
type pooledConn struct {
	net.Conn
	pool      *connPool
	answering bool
	since     time.Time
	closeOnce sync.Once
}

func (c *pooledConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() { c.pool.release(c) })
	return err
}

// setAnswering marks c as being answered, or as waiting again since now, when a connection waiting for a place
// may take c's.
func (c *pooledConn) setAnswering(answering bool) {
	c.pool.mu.Lock()
	c.answering, c.since = answering, time.Now()
	c.pool.mu.Unlock()
	if !answering {
		select {
		case c.pool.freed <- struct{}{}:
		default:
		}
	}
}

type pooledConnKey struct{}

// withPooledConn keeps a request's connection in its context (http.Server.ConnContext), for answering.
func withPooledConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, pooledConnKey{}, c)
}

// answering reads a request's body (up to one byte past maxBody, for next to refuse as too large), then marks
// its connection as being answered while next handles it, so that no new connection takes its place. A
// connection still sending its body is not being answered: a client that sends headers and then nothing would
// otherwise hold its place until readTimeout.
func answering(next http.Handler, maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			return // the connection timed out or was evicted; nothing to answer
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if c, ok := r.Context().Value(pooledConnKey{}).(*pooledConn); ok {
			c.setAnswering(true)
			defer c.setAnswering(false)
		}
		next.ServeHTTP(w, r)
	})
}
