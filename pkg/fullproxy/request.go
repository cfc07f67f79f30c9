package fullproxy

import (
	"io"
	"net"
	"strings"

	"github.com/kvgate/kvgate/pkg/fullproxy/internal/http1"
)

// HeaderField is one request or response header as received.
type HeaderField = http1.HeaderField

// ErrorBody is the JSON shape of every error kvgate answers itself:
// {"error":"<code>","detail":"…"}.
type ErrorBody = http1.ErrorBody

// Request is one client request as the proxy read it. Handlers and routers
// read it; the proxy owns it. It is valid until the request ends.
type Request struct {
	Method string
	Target string
	// Minor is the HTTP/1.x minor version (0 or 1).
	Minor  int
	Header []HeaderField

	// ContentLength is the declared length, or -1 for chunked or no body.
	ContentLength int64
	Chunked       bool
	// KeepAlive reports whether the client wants the connection kept.
	KeepAlive      bool
	ExpectContinue bool

	// Body holds the whole request body when BodyInspected is true. Bodies
	// above the inspection limit are streamed to the backend unread:
	// BodyInspected is false and Body is nil.
	Body          []byte
	BodyInspected bool

	// RemoteAddr is the client's address.
	RemoteAddr net.Addr

	// streamed request body (uninspected): the already-buffered prefix and
	// the reader for the rest, bounded by the body limit.
	bodyPrefix []byte
	bodyRest   io.Reader
	bodyDone   bool
}

func newRequest(h *http1.RequestHead, remote net.Addr) *Request {
	return &Request{Method: h.Method, Target: h.Target, Minor: h.Minor, Header: h.Header, ContentLength: h.ContentLength,
		Chunked: h.Chunked, KeepAlive: h.KeepAlive, ExpectContinue: h.ExpectContinue, RemoteAddr: remote}
}

// Get returns the first value of the named header (case-insensitive), or "".
func (r *Request) Get(name string) string {
	for _, h := range r.Header {
		if strings.EqualFold(h.Name, name) {
			return h.Value
		}
	}
	return ""
}

// Path is the request target without its query.
func (r *Request) Path() string {
	if i := strings.IndexByte(r.Target, '?'); i >= 0 {
		return r.Target[:i]
	}
	return r.Target
}
