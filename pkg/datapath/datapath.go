// Package datapath is the seam between the proxy and whatever moves a
// response body from the backend to the client.
//
// The proxy reads and forwards the response status line and headers itself
// (it needs the status for the circuit breaker and the time to first byte),
// then hands the rest of the response to a BodyLeg, with a BodyEnd that
// follows the body's framing (Options.End): the legs move bytes and know no
// HTTP. A BodyLeg runs until the body ends, the client goes away, or the
// stream falls silent, and reports what it moved. The userspace copy lives
// here; the eBPF sockmap splice (package splice) implements the same
// interface.
package datapath

import (
	"context"
	"net"
	"time"
)

// Ending says how a body leg finished.
type Ending int

const (
	// BackendEOF: the body ended completely: by its own framing (as
	// Options.End tells it), or, for a body delimited by the connection,
	// when the backend closed.
	BackendEOF Ending = iota
	// ClientGone: writing to the client failed or the client closed.
	ClientGone
	// Silence: no byte moved for Options.Silence.
	Silence
	// Cancelled: the context ended (shutdown grace exhausted, request cancelled).
	Cancelled
	// BackendError: reading from the backend failed (reset, not a clean EOF).
	BackendError
	// BackendBroken: the backend closed before the body's end (as
	// Options.End tells it: a body without its last chunk, a body short of
	// its declared length), or the framing itself was malformed. The client
	// connection must be closed: it cannot find the end of the body
	// (docs/body-leg.md).
	BackendBroken
)

func (e Ending) String() string {
	switch e {
	case BackendEOF:
		return "backend_eof"
	case ClientGone:
		return "client_gone"
	case Silence:
		return "silence"
	case Cancelled:
		return "cancelled"
	case BackendError:
		return "backend_error"
	case BackendBroken:
		return "backend_broken"
	}
	return "unknown"
}

// Options bound one body leg.
type Options struct {
	// Silence ends the leg when no byte has moved for this long; 0 means no bound.
	Silence time.Duration
	// Streamed is true for bodies that arrive over time without a declared
	// length (the proxy sets it from the response head); a BodyLeg may use
	// it (with ContentLength) to decide whether moving the body in the
	// kernel is worth it.
	Streamed bool
	// TokenStream is true when the content type says the body is a stream
	// of events (text/event-stream, application/x-ndjson): a token stream.
	// --datapath=auto splices only these; a chunked JSON body is bulk.
	TokenStream bool
	// ContentLength is the declared body length, or -1 when unknown: a size
	// hint only; End finds the body's end.
	ContentLength int64
	// End follows the body's framing as the leg relays it: where the body
	// ends, whether the backend broke it, and what to tell the client then.
	// The proxy makes one per response; nil means the body ends when the
	// backend closes (see WithEnd).
	End BodyEnd
	// Tap, when set, sees every body byte written to the client, in wire
	// form, after the write (the per-request usage audit, docs/parity.md).
	// A tapped body is copied in userspace: bytes the kernel moves are never
	// seen. Tap must not keep p.
	Tap func(p []byte)
	// FirstBody, when set, is called once, when the leg first relays body
	// bytes that passed through userspace (the routing cost model learns
	// time to first token from it; docs/selection.md, "Cost mode"). Bytes
	// the kernel splices without userspace seeing them do not call it.
	FirstBody func()
}

// Result reports what a body leg did.
type Result struct {
	// Bytes is the number of body bytes written to the client, including the
	// already-read prefix.
	Bytes int64
	// KernelBytes is the part of Bytes that moved without passing through
	// userspace (0 for the userspace path).
	KernelBytes int64
	// LastActivity is when the last byte moved.
	LastActivity time.Time
	Ending       Ending
	// Err carries the underlying error for ClientGone and BackendError.
	Err error
	// Path names the implementation that moved the body: "userspace" or "sockmap".
	Path string
	// ErrorEvent is true when the leg ended a broken body with the bytes of
	// End.BrokenEnd (an event stream's final error event; they are not in
	// Bytes).
	ErrorEvent bool
}

// BodyLeg moves a response body from backend to client.
//
// prefix holds body bytes the proxy already read together with the response
// head; they are written to the client first, so no byte is reordered, lost
// or duplicated. On return the backend connection is finished with; the
// client connection is still usable for its next keep-alive request only
// when the ending is BackendEOF. A leg writes no byte past the body's end
// (opts.End) and no byte of framing of its own.
type BodyLeg interface {
	Run(ctx context.Context, client, backend net.Conn, prefix []byte, opts Options) Result
	// Path names the implementation: "userspace" or "sockmap".
	Path() string
}
