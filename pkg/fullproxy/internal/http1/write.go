package http1

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// Continue is the interim answer to "Expect: 100-continue".
const Continue = "HTTP/1.1 100 Continue\r\n\r\n"

// LastChunk ends a chunked body without trailers.
const LastChunk = "0\r\n\r\n"

// Outgoing describes the head of a request sent to a backend: the client's
// request line and headers, minus hop-by-hop ones and those Drop names
// (lower case), plus Set, with framing written by kvgate alone.
type Outgoing struct {
	Method, Target string
	Header         []HeaderField
	// HostFallback is the Host sent when the client sent none (the backend's
	// address).
	HostFallback string
	// ClientAddr is the client's host:port, appended to X-Forwarded-For.
	ClientAddr string
	Drop       map[string]bool
	Set        []HeaderField
	// Chunked frames the body as chunked; otherwise ContentLength is sent.
	Chunked       bool
	ContentLength int64
	// KeepAlive leaves out "Connection: close": the request goes on a
	// pooled backend connection that may carry the next one
	// (docs/security.md, "Engine connection pool").
	KeepAlive bool
}

// EncodeRequestHead renders o, ending with "Connection: close" (unless
// o.KeepAlive) and the blank line.
func EncodeRequestHead(o Outgoing) []byte {
	var b strings.Builder
	b.Grow(512 + 64*len(o.Header))
	b.WriteString(o.Method)
	b.WriteByte(' ')
	b.WriteString(o.Target)
	b.WriteString(" HTTP/1.1\r\n")
	named := ConnectionNamed(o.Header)
	delete(named, "host") // Host is end-to-end: a Connection header naming it must not strip it
	hasHost := false
	for _, h := range o.Header {
		ln := strings.ToLower(h.Name)
		if HopByHop[ln] || named[ln] || o.Drop[ln] || ln == "content-length" || ln == "transfer-encoding" || ln == "expect" || ln == "x-forwarded-for" {
			continue
		}
		if ln == "host" {
			hasHost = true
		}
		writeHeader(&b, h.Name, h.Value)
	}
	if !hasHost {
		writeHeader(&b, "Host", o.HostFallback)
	}
	if host, _, err := net.SplitHostPort(o.ClientAddr); err == nil {
		for _, h := range o.Header {
			if strings.EqualFold(h.Name, "X-Forwarded-For") {
				host = h.Value + ", " + host
				break
			}
		}
		writeHeader(&b, "X-Forwarded-For", host)
	}
	for _, h := range o.Set {
		writeHeader(&b, h.Name, h.Value)
	}
	if o.Chunked {
		b.WriteString("Transfer-Encoding: chunked\r\n")
	} else {
		b.WriteString("Content-Length: ")
		b.WriteString(strconv.FormatInt(o.ContentLength, 10))
		b.WriteString("\r\n")
	}
	if !o.KeepAlive {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("\r\n")
	return []byte(b.String())
}

// WriteChunk writes p as one chunk of a chunked body.
func WriteChunk(w io.Writer, p []byte) error {
	if _, err := fmt.Fprintf(w, "%x\r\n", len(p)); err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\r\n")
	return err
}

// writeHeader writes one "Name: value" header line.
func writeHeader(b *strings.Builder, name, value string) {
	b.WriteString(name)
	b.WriteString(": ")
	b.WriteString(value)
	b.WriteString("\r\n")
}

// DecisionHeader is the response header carrying kvgate's routing decision.
const DecisionHeader = "x-kvgate-decision"

// RelayedHead renders the head the client gets for a relayed response: the
// backend's status and headers (framing kept, since the body passes
// verbatim), x-kvgate-decision when decision is not empty, and the proxy's
// own Connection header for a client speaking HTTP/1.minor.
func RelayedHead(rh *ResponseHead, minor int, decision string, keep bool) []byte {
	var b strings.Builder
	b.Grow(512)
	b.WriteString("HTTP/1.1 ")
	b.WriteString(strconv.Itoa(rh.Status))
	b.WriteByte(' ')
	b.WriteString(rh.Reason)
	b.WriteString("\r\n")
	named := ConnectionNamed(rh.Header)
	for _, h := range rh.Header {
		ln := strings.ToLower(h.Name)
		if ln == "connection" || ln == "keep-alive" || ln == "proxy-connection" || ln == "upgrade" || named[ln] {
			continue
		}
		writeHeader(&b, h.Name, h.Value)
	}
	if decision != "" {
		writeHeader(&b, DecisionHeader, decision)
	}
	endResponseHead(&b, minor, keep)
	return []byte(b.String())
}

// CompleteHead renders the head of a response kvgate sends whole with a
// Content-Length body of n bytes: status and headers as given minus framing
// and hop-by-hop ones, x-kvgate-decision when decision is not empty.
func CompleteHead(status int, header []HeaderField, n int, decision string, minor int, keep bool) []byte {
	var b strings.Builder
	b.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + ReasonPhrase(status) + "\r\n")
	named := ConnectionNamed(header)
	for _, h := range header {
		ln := strings.ToLower(h.Name)
		if HopByHop[ln] || named[ln] || ln == "content-length" || ln == "transfer-encoding" {
			continue
		}
		writeHeader(&b, h.Name, h.Value)
	}
	if decision != "" {
		writeHeader(&b, DecisionHeader, decision)
	}
	b.WriteString("Content-Length: " + strconv.Itoa(n) + "\r\n")
	endResponseHead(&b, minor, keep)
	return []byte(b.String())
}

// endResponseHead writes the proxy's Connection header and the blank line:
// HTTP/1.1 clients keep the connection by default, HTTP/1.0 ones are told.
func endResponseHead(b *strings.Builder, minor int, keep bool) {
	if keep {
		if minor == 0 {
			b.WriteString("Connection: keep-alive\r\n")
		}
	} else {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("\r\n")
}

// ErrorBody is the JSON shape of every error kvgate answers itself.
type ErrorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

// ErrorResponse renders {"error":code,"detail":detail} with status and
// extra headers (Retry-After): the head and the body.
func ErrorResponse(status int, code, detail string, keep bool, extra ...HeaderField) (head, body []byte) {
	body, _ = json.Marshal(ErrorBody{Error: code, Detail: detail})
	var b strings.Builder
	b.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + ReasonPhrase(status) + "\r\nContent-Type: application/json\r\n")
	for _, h := range extra {
		writeHeader(&b, h.Name, h.Value)
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	if keep {
		b.WriteString("Connection: keep-alive\r\n\r\n")
	} else {
		b.WriteString("Connection: close\r\n\r\n")
	}
	return []byte(b.String()), body
}

// ReasonPhrase is the reason phrase of the statuses kvgate answers itself.
func ReasonPhrase(code int) string {
	switch code {
	case 200:
		return "OK"
	case 429:
		return "Too Many Requests"
	}
	if t := statusText(code); t != "Error" {
		return t
	}
	switch {
	case code >= 200 && code < 300:
		return "OK"
	case code >= 400 && code < 500:
		return "Client Error"
	}
	return "Error"
}

func statusText(code int) string {
	switch code {
	case 400:
		return "Bad Request"
	case 408:
		return "Request Timeout"
	case 413:
		return "Content Too Large"
	case 417:
		return "Expectation Failed"
	case 431:
		return "Request Header Fields Too Large"
	case 502:
		return "Bad Gateway"
	case 503:
		return "Service Unavailable"
	case 504:
		return "Gateway Timeout"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Error"
}
