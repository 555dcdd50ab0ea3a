package testkit

import (
	"errors"
	"net"
	"sync"
)

// Proxy forwards connections from its address to a target.
type Proxy struct {
	listener net.Listener
	target   string

	mu        sync.Mutex
	cut       bool
	blackhole bool
	passing   *sync.Cond // broadcast when the blackhole ends
	conns     map[net.Conn]struct{}
	done      chan struct{}
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{listener: l, target: target, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.passing = sync.NewCond(&p.mu)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.blackhole = true, false
	p.passing.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

// Blackhole passes no byte either way, on live connections and new ones, and closes none, until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = true
}

// Restore accepts connections again, and passes what a blackhole held.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.blackhole = false, false
	p.passing.Broadcast()
}

// waitPassing blocks while a blackhole holds the link; false: the connection was closed meanwhile.
func (p *Proxy) waitPassing(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.blackhole {
		p.passing.Wait()
	}
	_, open := p.conns[c]
	return open
}

// Close stops the proxy.
func (p *Proxy) Close() error {
	p.Cut()
	close(p.done)
	return p.listener.Close()
}

func (p *Proxy) serve() {
	for {
		in, err := p.listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			in.Close()
			continue
		}
		go p.forward(in)
	}
}

func (p *Proxy) forward(in net.Conn) {
	p.mu.Lock()
	for p.blackhole && !p.cut {
		p.passing.Wait()
	}
	p.mu.Unlock()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		in.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.conns[in], p.conns[out] = struct{}{}, struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !p.waitPassing(src) {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}
