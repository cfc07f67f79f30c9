// Package http1 is kvgate's HTTP/1.1 wire code, shared by every handler of
// package fullproxy: reading and validating request heads, decoding chunked
// bodies under bounds, parsing backend response heads, following a relayed
// response body's framing for the body legs (BodyFraming, the proxy's
// datapath.BodyEnd), and writing request heads, response heads and kvgate's
// own error answers. Nothing outside fullproxy speaks HTTP framing
// (docs/dataplane.md, "Request path"; docs/body-leg.md, "Broken responses").
package http1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// HeaderField is one request or response header as received.
type HeaderField struct {
	Name  string
	Value string
}

// RequestHead is a parsed request head and its framing.
type RequestHead struct {
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
}

// Error is a request the proxy refuses: the status, the error code and
// the detail of kvgate's error answer.
type Error struct {
	Status int
	Code   string
	Detail string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Detail) }

func badRequest(format string, args ...any) *Error {
	return &Error{Status: 400, Code: "bad_request", Detail: fmt.Sprintf(format, args...)}
}

var (
	// ErrHeadTooLarge refuses a head above its bound (431).
	ErrHeadTooLarge = &Error{Status: 431, Code: "request_header_too_large", Detail: "request head exceeds the limit"}
	// ErrBodyTooLarge refuses a request body above its bound (413).
	ErrBodyTooLarge = &Error{Status: 413, Code: "request_body_too_large", Detail: "request body exceeds the limit"}
)

// ReadHead reads one request head (request line through the empty line) of
// at most max bytes. Empty lines before the request line are skipped, as RFC
// 9112 §2.2 allows.
func ReadHead(br *bufio.Reader, max int) ([]byte, error) {
	var head []byte
	for {
		line, err := readLine(br, max-len(head))
		if err != nil {
			return nil, err
		}
		if len(head) == 0 && isBlank(line) {
			if max -= len(line); max <= 0 {
				return nil, ErrHeadTooLarge
			}
			continue
		}
		head = append(head, line...)
		if isBlank(line) {
			return head, nil
		}
	}
}

// readLine reads through the next '\n', failing with ErrHeadTooLarge beyond max bytes.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, ErrHeadTooLarge
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

// ParseRequestHead parses a request head and its framing. Anything ambiguous is a
// 400: a proxy that reads framing differently from its backend is the root
// of request smuggling, so the backend leg only ever sees framing kvgate
// rewrote itself.
func ParseRequestHead(head []byte) (*RequestHead, error) {
	lines := splitLines(head)
	if len(lines) == 0 {
		return nil, badRequest("empty request")
	}
	r := &RequestHead{ContentLength: -1}
	if err := r.parseRequestLine(lines[0]); err != nil {
		return nil, err
	}
	var f framing
	for _, l := range lines[1:] {
		if len(l) == 0 {
			break
		}
		name, value, err := parseHeaderLine(l)
		if err != nil {
			return nil, err
		}
		r.Header = append(r.Header, HeaderField{Name: name, Value: value})
		if err := f.note(r, name, value); err != nil {
			return nil, err
		}
	}
	if err := f.apply(r); err != nil {
		return nil, err
	}
	return r, nil
}

// parseHeaderLine splits and validates one header line.
func parseHeaderLine(l []byte) (name, value string, err error) {
	if l[0] == ' ' || l[0] == '\t' {
		return "", "", badRequest("obsolete header line folding")
	}
	colon := bytes.IndexByte(l, ':')
	if colon <= 0 {
		return "", "", badRequest("header line without a name: %q", truncateForError(l))
	}
	name = string(l[:colon])
	if !isToken(name) {
		return "", "", badRequest("invalid header name %q", truncateForError(l[:colon]))
	}
	value = strings.Trim(string(l[colon+1:]), " \t")
	if !validFieldValue(value) {
		return "", "", badRequest("invalid characters in header %s", name)
	}
	return name, value, nil
}

// framing collects the headers that decide a request's framing and
// connection, so they are judged together once the head is read.
type framing struct {
	clSeen, teSeen, hostSeen int
	te                       []string
	connTokens               []string
}

// note records one header; Content-Length conflicts and a bad Expect are
// refused at once.
func (f *framing) note(r *RequestHead, name, value string) error {
	switch strings.ToLower(name) {
	case "content-length":
		n, err := ParseContentLength(value)
		if err != nil {
			return err
		}
		if f.clSeen > 0 && n != r.ContentLength {
			return badRequest("conflicting Content-Length headers")
		}
		r.ContentLength = n
		f.clSeen++
	case "transfer-encoding":
		f.teSeen++
		f.te = appendTokens(f.te, value)
	case "host":
		f.hostSeen++
	case "connection":
		f.connTokens = appendTokens(f.connTokens, value)
	case "expect":
		if !strings.EqualFold(value, "100-continue") {
			return &Error{Status: 417, Code: "expectation_failed", Detail: "only Expect: 100-continue is supported"}
		}
		r.ExpectContinue = true
	}
	return nil
}

// appendTokens appends the comma-separated tokens of value, lower-cased.
func appendTokens(dst []string, value string) []string {
	for _, v := range strings.Split(value, ",") {
		if v = strings.Trim(v, " \t"); v != "" {
			dst = append(dst, strings.ToLower(v))
		}
	}
	return dst
}

// apply judges the collected headers: Host, Transfer-Encoding against
// Content-Length and the version, and keep-alive.
func (f *framing) apply(r *RequestHead) error {
	if r.Minor == 1 && f.hostSeen != 1 {
		return badRequest("an HTTP/1.1 request needs exactly one Host header")
	}
	if f.teSeen > 0 {
		if f.clSeen > 0 {
			return badRequest("both Content-Length and Transfer-Encoding")
		}
		if r.Minor == 0 {
			return badRequest("Transfer-Encoding in an HTTP/1.0 request")
		}
		if len(f.te) != 1 || f.te[0] != "chunked" {
			return badRequest("unsupported Transfer-Encoding %q (only chunked)", strings.Join(f.te, ", "))
		}
		r.Chunked = true
	}
	// HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes
	// unless told to keep it. A close anywhere wins.
	r.KeepAlive = r.Minor == 1
	for _, t := range f.connTokens {
		if t == "keep-alive" && r.Minor == 0 {
			r.KeepAlive = true
		}
	}
	for _, t := range f.connTokens {
		if t == "close" {
			r.KeepAlive = false
		}
	}
	return nil
}

func (r *RequestHead) parseRequestLine(l []byte) error {
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
		return &Error{Status: 505, Code: "http_version_not_supported", Detail: "kvgate speaks HTTP/1.0 and HTTP/1.1"}
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

func ParseContentLength(v string) (int64, error) {
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
