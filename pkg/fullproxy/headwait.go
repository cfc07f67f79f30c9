package fullproxy

// Waits on a backend that has sent no response byte yet, watched for the
// endpoint going down. An engine that hangs (SIGSTOP, a wedged GPU) still
// accepts connections and takes request bytes into its socket buffers, so
// without this a request sent to it waited the whole ResponseHeaderTimeout
// (600 s), counted in flight on the hung endpoint. When the health probe
// marks the endpoint down the gateway calls Server.EndpointDown, which
// wakes every such wait at once; the handler then re-routes the request
// once or answers 503 endpoint_down (docs/dataplane.md, "Hung engines and
// departed clients").

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// headWaits is the set of registered waits, one shard per endpoint so
// requests to different endpoints never share a lock. The zero value is
// ready.
type headWaits struct {
	shards [epset.Max]waitShard
}

type waitShard struct {
	mu  sync.Mutex
	set map[*EndpointWatch]struct{}
}

func (ws *headWaits) shard(ep int) *waitShard {
	if uint(ep) >= epset.Max {
		return nil
	}
	return &ws.shards[ep]
}

// EndpointWatch is one backend connection waiting for its first response
// byte, registered so that its endpoint going down ends the wait. Make one
// with Exchange.WatchEndpoint; ReadResponse ends the registration at the
// first byte, and Stop ends it in any case.
type EndpointWatch struct {
	sh *waitShard // nil: an ep_idx out of range, never watched
	bc net.Conn
	// down: the endpoint went down first; answered: the first response
	// byte came (it wins over a down in the same instant).
	down, answered atomic.Bool
	ended          bool // under sh.mu
}

// WatchEndpoint registers bc, connected to ep, until its first response
// byte: Server.EndpointDown(ep) meanwhile expires bc's deadlines, so the
// request write or the head wait on it fails at once, and Down reports
// true. Call Stop when the exchange is done (it is idempotent). Only one
// watch per Exchange is active; a new one replaces the old.
func (x *Exchange) WatchEndpoint(ep int, bc net.Conn) *EndpointWatch {
	w := &EndpointWatch{sh: x.s.waits.shard(ep), bc: bc}
	if w.sh != nil {
		w.sh.mu.Lock()
		if w.sh.set == nil {
			w.sh.set = map[*EndpointWatch]struct{}{}
		}
		w.sh.set[w] = struct{}{}
		w.sh.mu.Unlock()
	}
	x.watch = w
	return w
}

// Down reports whether the endpoint went down before the first response
// byte.
func (w *EndpointWatch) Down() bool { return w != nil && w.down.Load() }

// Stop ends the registration and reports whether the endpoint went down
// before it.
func (w *EndpointWatch) Stop() bool {
	if w == nil {
		return false
	}
	w.end()
	return w.down.Load()
}

func (w *EndpointWatch) end() {
	if w.sh == nil {
		return
	}
	w.sh.mu.Lock()
	defer w.sh.mu.Unlock()
	if !w.ended {
		w.ended = true
		delete(w.sh.set, w)
	}
}

// answered ends the watch of bc at its first response byte: a request that
// got a byte is never touched. When the endpoint went down in the same
// instant, the byte wins; the caller re-arms bc's read deadline after this.
func (x *Exchange) answered(bc net.Conn) {
	if w := x.watch; w != nil && w.bc == bc {
		w.answered.Store(true)
		w.end()
	}
}

// EndpointDown ends every wait on ep that has received no response byte
// (the health probe marked ep down): each one's backend connection gets an
// expired deadline, so its handler wakes at once and re-routes the request
// or answers 503 endpoint_down. It returns how many waits it ended and must
// not block: the health tracker calls it synchronously.
func (s *Server) EndpointDown(ep int) int {
	sh := s.waits.shard(ep)
	if sh == nil {
		return 0
	}
	sh.mu.Lock()
	n := 0
	for w := range sh.set {
		w.ended = true
		delete(sh.set, w)
		if w.answered.Load() {
			continue
		}
		w.down.Store(true)
		_ = w.bc.SetDeadline(expiredDeadline)
		n++
	}
	sh.mu.Unlock()
	if n > 0 {
		s.log.Warn("endpoint down: ending the requests that had no response byte from it", "ep", ep, "requests", n)
	}
	// Its idle pooled connections go too: the next request after the
	// endpoint is back opens a fresh one.
	s.DropIdleBackends(ep)
	return n
}

// Replayable reports whether the request can be sent again to another
// endpoint: its body was read whole (inspected, or empty). A streamed body
// is consumed as it is forwarded and cannot be.
func (x *Exchange) Replayable() bool { return x.Req.BodyInspected }

// HeadWatch watches one backend exchange until its response head: the
// client going away (noticed at once by WatchClient's peek) and the
// endpoint going down (WatchEndpoint) each expire the backend connection's
// deadlines, so the request write or the head wait on it ends at once and
// the handler closes the connection (the engine aborts the request).
// While a streamed request body is still being forwarded the client is
// not peeked at: reading that body notices a departed client itself.
type HeadWatch struct {
	x      *Exchange
	parent context.Context
	bc     net.Conn
	ep     *EndpointWatch

	client     context.Context
	stopClient func()
	stopClose  func() bool
	watching   bool // the client is peeked at
	stopped    bool
	left       bool // the client went away (fixed at Stop)
}

// WatchHead starts both watches on bc, connected to ep. Call BodySent once
// the request is sent, and Stop before the client connection is used again
// (writing the response head, or an error).
func (x *Exchange) WatchHead(ctx context.Context, ep int, bc net.Conn) *HeadWatch {
	h := &HeadWatch{x: x, parent: ctx, bc: bc}
	h.ep = x.WatchEndpoint(ep, bc)
	h.watchClient()
	x.head = h
	return h
}

func (h *HeadWatch) watchClient() {
	h.client, h.stopClient = h.x.WatchClient(h.parent)
	h.stopClose = CloseOnCancel(h.client, h.bc)
	h.watching = h.x.Req.bodyDone
}

// BodySent starts peeking at the client after a streamed request body.
func (h *HeadWatch) BodySent() {
	if h.stopped || h.watching || !h.x.Req.bodyDone {
		return
	}
	h.stopClose()
	h.stopClient()
	h.watchClient()
}

// ClientLeft reports whether the client went away while the server was not
// cancelled.
func (h *HeadWatch) ClientLeft() bool {
	if h.stopped {
		return h.left
	}
	return h.client.Err() != nil && h.parent.Err() == nil
}

// EndpointDown reports whether the endpoint went down before its first
// response byte.
func (h *HeadWatch) EndpointDown() bool { return h.ep.Down() }

// Stop ends both watches; it is idempotent.
func (h *HeadWatch) Stop() {
	if h.stopped {
		return
	}
	h.left = h.ClientLeft()
	h.stopped = true
	h.ep.Stop()
	h.stopClose()
	h.stopClient()
}

// expiredDeadline is the deadline the watches set to end a wait at once.
var expiredDeadline = time.Unix(1, 0)

// armRead and armWrite set a deadline on bc unless a watch on bc (or the
// server's cancellation) has already expired it: the watches expire the
// deadline first and then record nothing more, so a deadline set after
// them must not revive the wait. The check follows the set, so an expiry
// racing with it is either seen here or lands after it.
func (x *Exchange) armRead(bc net.Conn, t time.Time) {
	_ = bc.SetReadDeadline(t)
	if x.expired(bc) {
		_ = bc.SetReadDeadline(expiredDeadline)
	}
}

func (x *Exchange) armWrite(bc net.Conn, t time.Time) {
	_ = bc.SetWriteDeadline(t)
	if x.expired(bc) {
		_ = bc.SetWriteDeadline(expiredDeadline)
	}
}

// expired reports whether a wait on bc was ended: the server cancelled, the
// client gone (HeadWatch), or the endpoint down before its first byte.
func (x *Exchange) expired(bc net.Conn) bool {
	if x.s.ctx.Err() != nil {
		return true
	}
	if h := x.head; h != nil && h.bc == bc && !h.stopped && h.client.Err() != nil {
		return true
	}
	w := x.watch
	return w != nil && w.bc == bc && w.down.Load() && !w.answered.Load()
}
