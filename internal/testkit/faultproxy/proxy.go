// Package faultproxy is an in-process TCP proxy for fault tests: it
// forwards connections to a target and, on request, cuts them (RST),
// stalls them silently (no bytes forwarded, no FIN, no RST), as a network
// partition looks to both ends, or slows them (a delay on every chunk).
package faultproxy

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection accepted on Addr to the target.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	latency time.Duration
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// New starts a proxy on a free loopback port forwarding to target
// (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Stall stops forwarding bytes in both directions on every connection,
// current and future, without closing anything: both ends see silence.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Resume forwards again what was held back and anything after.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// SetLatency delays every chunk forwarded in either direction by d, on
// current and future connections, like a slow link; 0 turns it off.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.mu.Unlock()
}

// Cut resets every current connection (both sides get RST). New
// connections are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy and resets every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[client] = struct{}{}
		p.conns[server] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// pipe copies src to dst, holding each chunk back while stalled. When
// either side ends, both are closed.
func (p *Proxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
		_ = src.Close()
		_ = dst.Close()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed {
				p.cond.Wait()
			}
			closed, latency := p.closed, p.latency
			p.mu.Unlock()
			if closed {
				return
			}
			if latency > 0 {
				time.Sleep(latency) // the delay is the fault: a slow link
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or reset: pass the end on by closing both
			return
		}
	}
}
