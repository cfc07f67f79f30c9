package fullproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// HeaderField is one request or response header as received.
type HeaderField struct {
	Name  string
	Value string
}

// Request is one client request as the proxy read it. Routers read it; the
// proxy owns it. It is valid until the request ends.
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

	// Scratch belongs to the Router: it may memoise per-request work there
	// (facts, token ids, hashes) so a retry after a connect failure does not
	// redo it.
	Scratch any

	// streamed request body (uninspected): the already-buffered prefix and
	// the reader for the rest, bounded by the body limit.
	bodyPrefix []byte
	bodyRest   io.Reader
	bodyDone   bool
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

// httpError is a request the proxy refuses before routing.
type httpError struct {
	status int
	code   string
	detail string
}

func (e *httpError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.detail) }

func badRequest(format string, args ...any) *httpError {
	return &httpError{status: 400, code: "bad_request", detail: fmt.Sprintf(format, args...)}
}

var (
	errHeadTooLarge = &httpError{status: 431, code: "request_header_too_large", detail: "request head exceeds the limit"}
	errBodyTooLarge = &httpError{status: 413, code: "request_body_too_large", detail: "request body exceeds the limit"}
)

// readHead reads one request head (request line through the empty line) of
// at most max bytes. Empty lines before the request line are skipped, as RFC
// 9112 §2.2 allows.
func readHead(br *bufio.Reader, max int) ([]byte, error) {
	var head []byte
	for {
		line, err := readLine(br, max-len(head))
		if err != nil {
			return nil, err
		}
		if len(head) == 0 && isBlank(line) {
			if max -= len(line); max <= 0 {
				return nil, errHeadTooLarge
			}
			continue
		}
		head = append(head, line...)
		if isBlank(line) {
			return head, nil
		}
	}
}

// readLine reads through the next '\n', failing with errHeadTooLarge beyond max bytes.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, errHeadTooLarge
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

func isBlank(line []byte) bool {
	return len(line) == 1 && line[0] == '\n' || len(line) == 2 && line[0] == '\r' && line[1] == '\n'
}

// parseHead parses a request head and its framing. Anything ambiguous is a
// 400: a proxy that reads framing differently from its backend is the root
// of request smuggling, so the backend leg only ever sees framing kvgate
// rewrote itself.
func parseHead(head []byte) (*Request, error) {
	lines := splitLines(head)
	if len(lines) == 0 {
		return nil, badRequest("empty request")
	}
	r := &Request{ContentLength: -1}
	if err := r.parseRequestLine(lines[0]); err != nil {
		return nil, err
	}
	var (
		clSeen, teSeen, hostSeen int
		te                       []string
		connTokens               []string
	)
	for _, l := range lines[1:] {
		if len(l) == 0 {
			break
		}
		if l[0] == ' ' || l[0] == '\t' {
			return nil, badRequest("obsolete header line folding")
		}
		colon := bytes.IndexByte(l, ':')
		if colon <= 0 {
			return nil, badRequest("header line without a name: %q", truncateForError(l))
		}
		name := string(l[:colon])
		if !isToken(name) {
			return nil, badRequest("invalid header name %q", truncateForError(l[:colon]))
		}
		value := strings.Trim(string(l[colon+1:]), " \t")
		if !validFieldValue(value) {
			return nil, badRequest("invalid characters in header %s", name)
		}
		r.Header = append(r.Header, HeaderField{Name: name, Value: value})
		switch strings.ToLower(name) {
		case "content-length":
			n, err := parseContentLength(value)
			if err != nil {
				return nil, err
			}
			if clSeen > 0 && n != r.ContentLength {
				return nil, badRequest("conflicting Content-Length headers")
			}
			r.ContentLength = n
			clSeen++
		case "transfer-encoding":
			teSeen++
			for _, v := range strings.Split(value, ",") {
				if v = strings.Trim(v, " \t"); v != "" {
					te = append(te, strings.ToLower(v))
				}
			}
		case "host":
			hostSeen++
		case "connection":
			for _, v := range strings.Split(value, ",") {
				if v = strings.Trim(v, " \t"); v != "" {
					connTokens = append(connTokens, strings.ToLower(v))
				}
			}
		case "expect":
			if strings.EqualFold(value, "100-continue") {
				r.ExpectContinue = true
			} else {
				return nil, &httpError{status: 417, code: "expectation_failed", detail: "only Expect: 100-continue is supported"}
			}
		}
	}

	if r.Minor == 1 && hostSeen != 1 {
		return nil, badRequest("an HTTP/1.1 request needs exactly one Host header")
	}
	if teSeen > 0 {
		if clSeen > 0 {
			return nil, badRequest("both Content-Length and Transfer-Encoding")
		}
		if r.Minor == 0 {
			return nil, badRequest("Transfer-Encoding in an HTTP/1.0 request")
		}
		if len(te) != 1 || te[0] != "chunked" {
			return nil, badRequest("unsupported Transfer-Encoding %q (only chunked)", strings.Join(te, ", "))
		}
		r.Chunked = true
	}

	r.KeepAlive = r.Minor == 1
	for _, t := range connTokens {
		switch t {
		case "close":
			r.KeepAlive = false
		case "keep-alive":
			if r.Minor == 0 {
				r.KeepAlive = true
			}
		}
	}
	for _, t := range connTokens {
		if t == "close" {
			r.KeepAlive = false
		}
	}
	return r, nil
}

func (r *Request) parseRequestLine(l []byte) error {
	parts := bytes.Split(l, []byte{' '})
	if len(parts) != 3 {
		return badRequest("malformed request line %q", truncateForError(l))
	}
	r.Method, r.Target = string(parts[0]), string(parts[1])
	if !isToken(r.Method) {
		return badRequest("invalid method")
	}
	if r.Target == "" || !validTarget(r.Target) {
		return badRequest("invalid request target")
	}
	switch string(parts[2]) {
	case "HTTP/1.1":
		r.Minor = 1
	case "HTTP/1.0":
		r.Minor = 0
	default:
		return &httpError{status: 505, code: "http_version_not_supported", detail: "kvgate speaks HTTP/1.0 and HTTP/1.1"}
	}
	return nil
}

// splitLines splits a head at '\n', dropping one trailing '\r' per line. A
// bare CR elsewhere stays in the line and fails validation.
func splitLines(head []byte) [][]byte {
	var out [][]byte
	for len(head) > 0 {
		i := bytes.IndexByte(head, '\n')
		if i < 0 {
			out = append(out, head)
			break
		}
		l := head[:i]
		if n := len(l); n > 0 && l[n-1] == '\r' {
			l = l[:n-1]
		}
		out = append(out, l)
		head = head[i+1:]
	}
	return out
}

func parseContentLength(v string) (int64, error) {
	if v == "" || len(v) > 18 {
		return 0, badRequest("invalid Content-Length %q", v)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, badRequest("invalid Content-Length %q", v)
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, badRequest("invalid Content-Length %q", v)
	}
	return n, nil
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func validTarget(t string) bool {
	for i := 0; i < len(t); i++ {
		if c := t[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

func truncateForError(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// chunkedReader decodes a chunked body (RFC 9112 §7.1), bounding chunk-size
// lines and trailers.
type chunkedReader struct {
	br        *bufio.Reader
	remaining int64 // bytes left in the current chunk
	started   bool
	done      bool
	err       error
}

const maxChunkLine = 4096

func newChunkedReader(br *bufio.Reader) *chunkedReader { return &chunkedReader{br: br} }

func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	for c.remaining == 0 {
		if c.started {
			if err := c.expectCRLF(); err != nil {
				c.err = err
				return 0, err
			}
		}
		c.started = true
		size, err := c.readSize()
		if err != nil {
			c.err = err
			return 0, err
		}
		if size == 0 {
			if err := c.skipTrailers(); err != nil {
				c.err = err
				return 0, err
			}
			c.done = true
			return 0, io.EOF
		}
		c.remaining = size
	}
	if int64(len(p)) > c.remaining {
		p = p[:c.remaining]
	}
	n, err := c.br.Read(p)
	c.remaining -= int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		c.err = err
	}
	return n, err
}

func (c *chunkedReader) expectCRLF() error {
	line, err := readLine(c.br, 2)
	if err != nil {
		if errors.Is(err, errHeadTooLarge) {
			return badRequest("chunk data longer than its size")
		}
		return err
	}
	if !isBlank(line) {
		return badRequest("chunk data longer than its size")
	}
	return nil
}

func (c *chunkedReader) readSize() (int64, error) {
	line, err := readLine(c.br, maxChunkLine)
	if err != nil {
		if errors.Is(err, errHeadTooLarge) {
			return 0, badRequest("chunk-size line too long")
		}
		return 0, err
	}
	line = bytes.TrimRight(line, "\r\n")
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, badRequest("invalid chunk size")
	}
	var n int64
	for _, ch := range line {
		var d byte
		switch {
		case ch >= '0' && ch <= '9':
			d = ch - '0'
		case ch >= 'a' && ch <= 'f':
			d = ch - 'a' + 10
		case ch >= 'A' && ch <= 'F':
			d = ch - 'A' + 10
		default:
			return 0, badRequest("invalid chunk size")
		}
		n = n<<4 | int64(d)
	}
	return n, nil
}

func (c *chunkedReader) skipTrailers() error {
	total := 0
	for {
		line, err := readLine(c.br, maxChunkLine)
		if err != nil {
			if errors.Is(err, errHeadTooLarge) {
				return badRequest("trailer line too long")
			}
			return err
		}
		if isBlank(line) {
			return nil
		}
		if total += len(line); total > 16*maxChunkLine {
			return badRequest("trailers too large")
		}
	}
}

// limitedBody fails with errBodyTooLarge once more than max bytes were read.
type limitedBody struct {
	r   io.Reader
	n   int64 // bytes still allowed
	err error
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	if int64(n) > l.n {
		l.err = errBodyTooLarge
		return int(l.n), l.err
	}
	l.n -= int64(n)
	return n, err
}
