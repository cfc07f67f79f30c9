// Package datapath is the seam between the proxy and whatever moves a
// response body from the backend to the client.
//
// The proxy reads and forwards the response status line and headers itself
// (it needs the status for the circuit breaker and the time to first byte),
// then hands the rest of the response to a BodyLeg. A BodyLeg runs until the
// backend ends the body, the client goes away, or the stream falls silent,
// and reports what it moved. The userspace copy lives here; the eBPF sockmap
// splice (package splice) implements the same interface.
package datapath

import (
	"context"
	"net"
	"time"
)

// Ending says how a body leg finished.
type Ending int

const (
	// BackendEOF: the backend closed its side after the body; the normal end
	// on a per-request backend connection.
	BackendEOF Ending = iota
	// ClientGone: writing to the client failed or the client closed.
	ClientGone
	// Silence: no byte moved for Options.Silence.
	Silence
	// Cancelled: the context ended (shutdown grace exhausted, request cancelled).
	Cancelled
	// BackendError: reading from the backend failed (reset, not a clean EOF).
	BackendError
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
	}
	return "unknown"
}

// Options bound one body leg.
type Options struct {
	// Silence ends the leg when no byte has moved for this long; 0 means no bound.
	Silence time.Duration
	// Streamed is true for chunked or text/event-stream bodies; a BodyLeg may
	// use it (with ContentLength) to decide whether moving the body in the
	// kernel is worth it.
	Streamed bool
	// TokenStream is true when the content type says the body is a stream
	// of events (text/event-stream, application/x-ndjson): a token stream.
	// --datapath=auto splices only these; a chunked JSON body is bulk.
	TokenStream bool
	// ContentLength is the declared body length, or -1 when unknown.
	ContentLength int64
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
}

// BodyLeg moves a response body from backend to client.
//
// prefix holds body bytes the proxy already read together with the response
// head; they are written to the client first, so no byte is reordered, lost
// or duplicated. On return the backend connection is finished with; the
// client connection is still usable for its next keep-alive request unless
// the ending says otherwise.
type BodyLeg interface {
	Run(ctx context.Context, client, backend net.Conn, prefix []byte, opts Options) Result
	// Path names the implementation: "userspace" or "sockmap".
	Path() string
}
