package http1

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
)

// ResponseHead is a parsed backend response head.
type ResponseHead struct {
	Status        int
	Reason        string
	Header        []HeaderField
	ContentLength int64 // -1 when absent
	Chunked       bool
	EventStream   bool
	NDJSON        bool // application/x-ndjson: a stream of JSON lines
	// Close: the backend will close the connection after this response
	// (Connection: close, or HTTP/1.0 without Connection: keep-alive), so
	// the connection cannot carry another request.
	Close bool
}

// ReadResponseHead reads a backend response head of at most max bytes,
// skipping interim 1xx responses (except 101, which the proxy never asks
// for since it strips Upgrade).
func ReadResponseHead(br *bufio.Reader, max int) (*ResponseHead, error) {
	for {
		raw, err := ReadHead(br, max)
		if err != nil {
			return nil, err
		}
		h, err := parseResponseHead(raw)
		if err != nil {
			return nil, err
		}
		if h.Status >= 100 && h.Status < 200 && h.Status != 101 {
			continue
		}
		return h, nil
	}
}

func parseResponseHead(raw []byte) (*ResponseHead, error) {
	lines := splitLines(raw)
	if len(lines) == 0 {
		return nil, badRequest("empty response head")
	}
	sl := string(lines[0])
	if !strings.HasPrefix(sl, "HTTP/1.") || len(sl) < 12 || sl[8] != ' ' {
		return nil, badRequest("malformed status line %q", truncateForError(lines[0]))
	}
	code, err := strconv.Atoi(sl[9:12])
	if err != nil || code < 100 || code > 999 || (len(sl) > 12 && sl[12] != ' ') {
		return nil, badRequest("malformed status line %q", truncateForError(lines[0]))
	}
	h := &ResponseHead{Status: code, ContentLength: -1, Close: sl[5:8] == "1.0"}
	if len(sl) > 13 {
		h.Reason = sl[13:]
	}
	for _, l := range lines[1:] {
		if len(l) == 0 {
			break
		}
		colon := bytes.IndexByte(l, ':')
		if colon <= 0 || l[0] == ' ' || l[0] == '\t' {
			return nil, badRequest("malformed response header line")
		}
		name := string(l[:colon])
		value := strings.Trim(string(l[colon+1:]), " \t")
		h.Header = append(h.Header, HeaderField{Name: name, Value: value})
		switch strings.ToLower(name) {
		case "content-length":
			n, err := ParseContentLength(value)
			if err != nil {
				return nil, err
			}
			h.ContentLength = n
		case "transfer-encoding":
			if strings.Contains(strings.ToLower(value), "chunked") {
				h.Chunked = true
			}
		case "connection":
			h.Close = connectionClose(value, h.Close)
		case "content-type":
			ct := strings.ToLower(strings.TrimSpace(value))
			if strings.HasPrefix(ct, "text/event-stream") {
				h.EventStream = true
			}
			if strings.HasPrefix(ct, "application/x-ndjson") {
				h.NDJSON = true
			}
		}
	}
	if h.Chunked {
		h.ContentLength = -1
	}
	return h, nil
}

// connectionClose applies one Connection header's value to whether the
// connection closes after the response: "close" closes it, "keep-alive"
// keeps an HTTP/1.0 one open; a "close" anywhere wins.
func connectionClose(value string, closing bool) bool {
	for _, tok := range strings.Split(value, ",") {
		switch strings.ToLower(strings.TrimSpace(tok)) {
		case "close":
			return true
		case "keep-alive":
			closing = false
		}
	}
	return closing
}

// Truncated reports whether a relayed body of n bytes ended short of (or
// past) its declared Content-Length.
func (h *ResponseHead) Truncated(n int64) bool {
	return h.ContentLength >= 0 && n != h.ContentLength
}

// Bodyless reports whether the response has no body whatever its headers say.
func (h *ResponseHead) Bodyless(method string) bool {
	return method == "HEAD" || h.Status == 204 || h.Status == 304 || (h.Status >= 100 && h.Status < 200)
}

// SelfDelimited reports whether the client can find the end of the body
// without the connection closing.
func (h *ResponseHead) SelfDelimited(method string) bool {
	return h.Bodyless(method) || h.Chunked || h.ContentLength >= 0
}

// HopByHop lists the hop-by-hop headers the proxy owns on each leg (RFC 9110 §7.6.1).
var HopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true,
	"upgrade": true, "trailer": true, "proxy-authenticate": true, "proxy-authorization": true,
}

// ConnectionNamed lists the headers a Connection header names, lower-cased.
func ConnectionNamed(hs []HeaderField) map[string]bool {
	var named map[string]bool
	for _, h := range hs {
		if !strings.EqualFold(h.Name, "connection") {
			continue
		}
		for _, t := range strings.Split(h.Value, ",") {
			if t = strings.ToLower(strings.Trim(t, " \t")); t != "" && t != "close" && t != "keep-alive" {
				if named == nil {
					named = map[string]bool{}
				}
				named[t] = true
			}
		}
	}
	return named
}
