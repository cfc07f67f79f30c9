package fullproxy

// The keep-alive pool of backend connections. A security-2 rule pays a TLS
// handshake for every new engine connection (0.5-0.9 ms of CPU on each
// side, docs/security.md), so its plain forward keeps a few idle
// connections per endpoint and sends the next request on one of them. A
// connection goes back only after a complete, self-delimited response the
// engine did not ask to close; an idle one closes before the engines' own
// keep-alive timeout would close it under a request; and one that turns
// out closed anyway before its first response byte is replaced by a fresh
// connection within the same try (docs/security.md, "Engine connection
// pool").

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// PoolOptions bound a rule's pool of idle backend connections. Zero fields
// take the defaults of DefaultPoolOptions.
type PoolOptions struct {
	// MaxIdlePerEndpoint is how many idle connections one endpoint keeps;
	// a connection handed back beyond it is closed.
	MaxIdlePerEndpoint int
	// IdleTimeout closes a connection idle for this long. It must stay
	// below the engines' keep-alive timeout (uvicorn's, vLLM's server, is
	// 5 s), so kvgate closes an idle connection before the engine does.
	IdleTimeout time.Duration
}

// DefaultPoolOptions are the pool bounds used for zero fields.
var DefaultPoolOptions = PoolOptions{MaxIdlePerEndpoint: 16, IdleTimeout: 4 * time.Second}

func (o PoolOptions) withDefaults() PoolOptions {
	d := DefaultPoolOptions
	if o.MaxIdlePerEndpoint > 0 {
		d.MaxIdlePerEndpoint = o.MaxIdlePerEndpoint
	}
	if o.IdleTimeout > 0 {
		d.IdleTimeout = o.IdleTimeout
	}
	return d
}

// PoolObserver is the optional part of an Observer that hears how backend
// connections were obtained (kvgate_backend_connections_total{result}).
type PoolObserver interface {
	// BackendConn: a request on ep got its connection by result: "reused"
	// (an idle pooled one), "dialed" (a new one) or "stale" (a pooled one
	// the engine had closed, replaced by a new one).
	BackendConn(service string, ep int, result string)
}

// Results of PoolObserver.BackendConn.
const (
	ConnReused = "reused"
	ConnDialed = "dialed"
	ConnStale  = "stale"
)

// poolKey is one endpoint's address: an endpoint index that moves to
// another address never gets the old address's connections.
type poolKey struct {
	ep   int
	addr string
}

type idleConn struct {
	c     net.Conn
	timer *time.Timer
}

// backendPool holds the idle connections of one rule, per endpoint. It is
// safe for concurrent use.
type backendPool struct {
	opts PoolOptions

	mu     sync.Mutex
	idle   map[poolKey][]*idleConn // most recently returned last
	closed bool
	// drops counts each endpoint's drops (under mu): a connection taken
	// before a drop is closed, not pooled, when its request ends, so a
	// request still running when its endpoint went down or was removed
	// does not put a connection back behind the drop.
	drops map[int]uint64
}

func newBackendPool(o PoolOptions) *backendPool {
	return &backendPool{opts: o.withDefaults(), idle: map[poolKey][]*idleConn{}, drops: map[int]uint64{}}
}

// get returns an idle connection to (ep, addr) that is still open, or nil.
// It takes the most recently returned one, the least likely to have been
// closed by the engine.
func (p *backendPool) get(ep int, addr string) net.Conn {
	k := poolKey{ep, addr}
	for range p.opts.MaxIdlePerEndpoint {
		c := p.pop(k)
		if c == nil {
			return nil
		}
		if stillOpen(c) {
			return c
		}
		_ = c.Close()
	}
	return nil
}

func (p *backendPool) pop(k poolKey) net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[k]
	if len(list) == 0 {
		return nil
	}
	ic := list[len(list)-1]
	list[len(list)-1] = nil
	if len(list) == 1 {
		delete(p.idle, k)
	} else {
		p.idle[k] = list[:len(list)-1]
	}
	ic.timer.Stop() // under mu: an expiry that already fired finds it gone
	return ic.c
}

// generation is ep's drop count, taken when a request gets its
// connection and given back to put.
func (p *backendPool) generation(ep int) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drops[ep]
}

// put hands c back idle, or closes it when the pool is closed, ep was
// dropped since gen, or the endpoint keeps its maximum already.
func (p *backendPool) put(ep int, addr string, c net.Conn, gen uint64) {
	k := poolKey{ep, addr}
	p.mu.Lock()
	if p.closed || p.drops[ep] != gen || len(p.idle[k]) >= p.opts.MaxIdlePerEndpoint {
		p.mu.Unlock()
		_ = c.Close() // outside mu: a TLS close writes close_notify, which can wait
		return
	}
	ic := &idleConn{c: c}
	ic.timer = time.AfterFunc(p.opts.IdleTimeout, func() { p.expire(k, ic) })
	p.idle[k] = append(p.idle[k], ic)
	p.mu.Unlock()
}

// expire closes ic if it is still idle after the idle timeout.
func (p *backendPool) expire(k poolKey, ic *idleConn) {
	p.mu.Lock()
	list := p.idle[k]
	found := false
	for i, o := range list {
		if o == ic {
			list = append(list[:i], list[i+1:]...)
			found = true
			break
		}
	}
	if len(list) == 0 {
		delete(p.idle, k)
	} else {
		p.idle[k] = list
	}
	p.mu.Unlock()
	if found {
		_ = ic.c.Close()
	}
}

// drop closes every idle connection to ep (any address) and returns how
// many it closed.
func (p *backendPool) drop(ep int) int {
	p.mu.Lock()
	p.drops[ep]++
	var gone []*idleConn
	for k, list := range p.idle {
		if k.ep == ep {
			gone = append(gone, list...)
			delete(p.idle, k)
		}
	}
	p.mu.Unlock()
	return closeIdle(gone)
}

// close closes every idle connection; connections handed back afterwards
// are closed at once.
func (p *backendPool) close() int {
	p.mu.Lock()
	p.closed = true
	var gone []*idleConn
	for k, list := range p.idle {
		gone = append(gone, list...)
		delete(p.idle, k)
	}
	p.mu.Unlock()
	return closeIdle(gone)
}

// idleCount is how many idle connections ep holds.
func (p *backendPool) idleCount(ep int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for k, list := range p.idle {
		if k.ep == ep {
			n += len(list)
		}
	}
	return n
}

func closeIdle(list []*idleConn) int {
	for _, ic := range list {
		ic.timer.Stop()
		_ = ic.c.Close()
	}
	return len(list)
}

// stillOpen reports whether an idle connection can carry a request. The
// socket is peeked without blocking (peekSocket): nothing pending means
// open; a FIN, a reset or pending bytes mean the engine closed or wrote
// unasked. On a TLS connection pending bytes may also be a post-handshake
// record (a session ticket, a key update), so they are read through TLS,
// for at most staleProbe: application data or an alert condemns the
// connection, a timeout after the record keeps it (crypto/tls keeps its
// state across a timeout).
func stillOpen(c net.Conn) bool {
	raw := c
	tc, isTLS := c.(*tls.Conn)
	if isTLS {
		raw = tc.NetConn()
	}
	switch peekSocket(raw) {
	case peekIdle:
		return true
	case peekClosed:
		return false
	case peekPending:
		if !isTLS {
			return false
		}
	}
	// peekPending on TLS, or a connection that cannot be peeked.
	if c.SetReadDeadline(time.Now().Add(staleProbe)) != nil {
		return false
	}
	var one [1]byte
	n, err := c.Read(one[:])
	if n > 0 || !IsTimeout(err) {
		return false
	}
	return c.SetReadDeadline(time.Time{}) == nil
}

// staleProbe bounds the TLS read of stillOpen.
const staleProbe = time.Millisecond

// peekResult is what a non-blocking peek at an idle socket found.
type peekResult int

const (
	peekUnknown peekResult = iota // not a socket that can be peeked
	peekIdle                      // open, nothing pending
	peekClosed                    // EOF or an error
	peekPending                   // bytes are waiting
)

// DropIdleBackends closes the idle pooled connections to ep: the endpoint
// was removed from the rule, changed its address, or was set admin down.
// Connections of requests still running on it close when those end. It
// returns how many idle ones it closed.
func (s *Server) DropIdleBackends(ep int) int {
	if s.pool == nil {
		return 0
	}
	return s.pool.drop(ep)
}

// IdleBackends is how many idle pooled connections ep holds (tests, and
// the drain checks of docs/security.md).
func (s *Server) IdleBackends(ep int) int {
	if s.pool == nil {
		return 0
	}
	return s.pool.idleCount(ep)
}

func (s *Server) closeIdleBackends() {
	if s.pool != nil {
		s.pool.close()
	}
}

// DialBackend connects to ep at addr for one request. With the rule's pool
// it returns, when reuse allows, an idle connection that is still open
// (reused true), else a new one; either is pool-managed: Forward sends the
// request without "Connection: close" on it, and ReleaseBackend hands it
// back or closes it. Without a pool it is Dial. Only a request whose body
// was read whole may take a reused connection, so that a stale one can be
// replaced and the request sent again (forward.go).
func (x *Exchange) DialBackend(ctx context.Context, ep int, addr string, reuse bool) (bc net.Conn, reused bool, err error) {
	p := x.s.pool
	if p == nil {
		bc, err = x.Dial(ctx, addr)
		return bc, false, err
	}
	x.pooledGen = p.generation(ep)
	if reuse && x.Replayable() {
		if bc = p.get(ep, addr); bc != nil {
			x.pooled = bc
			x.poolEvent(ep, ConnReused)
			return bc, true, nil
		}
	}
	bc, err = x.Dial(ctx, addr)
	if err != nil {
		return nil, false, err
	}
	x.pooled = bc
	x.poolEvent(ep, ConnDialed)
	return bc, false, nil
}

// ReleaseBackend ends a request's use of bc from DialBackend: it goes back
// to the pool when r (the response relayed on it, nil when none) ended
// complete by its own framing with nothing past it and the engine keeping
// the connection (BackendResponse.Reusable), reusable says the caller has
// no reason against it, and the request's waits left no expired deadline
// on it; otherwise it is closed. A nil bc is ignored.
func (x *Exchange) ReleaseBackend(ep int, addr string, bc net.Conn, r *BackendResponse, reusable bool) {
	if bc == nil {
		return
	}
	if x.pooled == bc {
		x.pooled = nil
	}
	p := x.s.pool
	if p == nil || !reusable || r == nil || !r.Reusable() || x.expired(bc) || bc.SetDeadline(time.Time{}) != nil {
		_ = bc.Close()
		return
	}
	p.put(ep, addr, bc, x.pooledGen)
}

func (x *Exchange) poolEvent(ep int, result string) {
	if o := x.s.poolObs; o != nil {
		o.BackendConn(x.s.cfg.Service, ep, result)
	}
}
