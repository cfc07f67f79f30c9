package fullproxy

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// responseHead is a parsed backend response head.
type responseHead struct {
	status        int
	reason        string
	header        []HeaderField
	contentLength int64 // -1 when absent
	chunked       bool
	eventStream   bool
	ndjson        bool // application/x-ndjson: a stream of JSON lines
}

// readResponseHead reads a backend response head of at most max bytes,
// skipping interim 1xx responses (except 101, which the proxy never asks
// for since it strips Upgrade).
func readResponseHead(br *bufio.Reader, max int) (*responseHead, error) {
	for {
		raw, err := readHead(br, max)
		if err != nil {
			return nil, err
		}
		h, err := parseResponseHead(raw)
		if err != nil {
			return nil, err
		}
		if h.status >= 100 && h.status < 200 && h.status != 101 {
			continue
		}
		return h, nil
	}
}

func parseResponseHead(raw []byte) (*responseHead, error) {
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
	h := &responseHead{status: code, contentLength: -1}
	if len(sl) > 13 {
		h.reason = sl[13:]
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
		h.header = append(h.header, HeaderField{Name: name, Value: value})
		switch strings.ToLower(name) {
		case "content-length":
			n, err := parseContentLength(value)
			if err != nil {
				return nil, err
			}
			h.contentLength = n
		case "transfer-encoding":
			if strings.Contains(strings.ToLower(value), "chunked") {
				h.chunked = true
			}
		case "content-type":
			ct := strings.ToLower(strings.TrimSpace(value))
			if strings.HasPrefix(ct, "text/event-stream") {
				h.eventStream = true
			}
			if strings.HasPrefix(ct, "application/x-ndjson") {
				h.ndjson = true
			}
		}
	}
	if h.chunked {
		h.contentLength = -1
	}
	return h, nil
}

// truncated reports whether a relayed body ended short of (or past) its
// declared Content-Length.
func (h *responseHead) truncated(res datapath.Result) bool {
	return h.contentLength >= 0 && res.Bytes != h.contentLength
}

// bodyless reports whether the response has no body whatever its headers say.
func (h *responseHead) bodyless(method string) bool {
	return method == "HEAD" || h.status == 204 || h.status == 304 || (h.status >= 100 && h.status < 200)
}

// selfDelimited reports whether the client can find the end of the body
// without the connection closing.
func (h *responseHead) selfDelimited(method string) bool {
	return h.bodyless(method) || h.chunked || h.contentLength >= 0
}

// hop-by-hop headers the proxy owns on each leg (RFC 9110 §7.6.1).
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true,
	"upgrade": true, "trailer": true, "proxy-authenticate": true, "proxy-authorization": true,
}

// connectionNamed lists the headers a Connection header names, lower-cased.
func connectionNamed(hs []HeaderField) map[string]bool {
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
