package http1

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// BodyFraming follows a response body's HTTP/1.1 framing as its bytes pass
// through a body leg, so the leg can tell a complete body from one the
// backend cut short: a chunked body must end with its last chunk ("0\r\n",
// trailers, "\r\n"), a Content-Length body with its last declared byte. A
// body with neither ends when the backend closes. It is the proxy's
// datapath.BodyEnd (docs/body-leg.md, "Broken responses").
//
// It keeps O(1) state: the position in the chunk grammar, the bytes left in
// the current chunk, and the last two data bytes (for the SSE event
// boundary). ChunkedReader decodes request bodies and buffered response
// bodies instead: it reads whole lines from a bufio.Reader and, like
// net/http, takes a bare LF as a line end, while BodyFraming checks every
// byte a client will parse, so the two stay apart.
type BodyFraming struct {
	chunked     bool
	eventStream bool  // text/event-stream: a break at an event boundary gets an error event
	length      int64 // declared length, or -1
	seen        int64 // body bytes accepted (fed and skipped)

	st      chunkState
	left    uint64 // data bytes left in the current chunk
	digits  int    // hex digits of the current size line
	lineLen int    // bytes of the current size, extension or trailer line
	last    [2]byte
	nData   int64 // data bytes seen (to know last is filled)
	err     error
	payload func([]byte) // when set, gets the chunk data (see Payload)

	// skipped: part of the body moved in the kernel; judged says what its
	// tail showed (see Skip).
	skipped bool
	judged  struct{ complete, boundary bool }
}

type chunkState uint8

const (
	csSize        chunkState = iota // reading the hex size
	csSizeWS                        // whitespace after the size: more, ';' or CR
	csExt                           // reading a chunk extension, up to CR
	csSizeLF                        // the LF ending the size line
	csData                          // chunk data
	csDataCR                        // the CR after the data
	csDataLF                        // the LF after the data
	csTrailer                       // at the start of a trailer line (or the final CRLF)
	csTrailerLine                   // inside a trailer line
	csTrailerLF                     // the LF ending a trailer line
	csFinalLF                       // the LF of the final CRLF
	csDone                          // the body is complete
)

// maxLine bounds a chunk-size, extension or trailer line.
const maxLine = 4096

// ErrBadFraming reports a chunked body that does not follow RFC 9112 §7.1.
var ErrBadFraming = errors.New("malformed chunked framing")

// NewBodyFraming tracks a body: chunked, or of the declared length (-1:
// until the backend closes); eventStream for a text/event-stream body.
func NewBodyFraming(chunked bool, contentLength int64, eventStream bool) *BodyFraming {
	if chunked {
		contentLength = -1
	}
	return &BodyFraming{chunked: chunked, length: contentLength, eventStream: eventStream}
}

// Feed accepts the next bytes of the body and returns how many belong to
// it: fewer than len(p) once the body is complete (bytes past its end are
// not the client's) or the framing broke (Err then says how). It
// implements datapath.BodyEnd.
func (f *BodyFraming) Feed(p []byte) int {
	switch {
	case f.err != nil || f.skipped || f.Complete():
		return 0
	case !f.chunked:
		n := int64(len(p))
		if f.length >= 0 && f.seen+n > f.length {
			n = f.length - f.seen
		}
		f.seen += n
		return int(n)
	}
	i := 0
	for i < len(p) && f.st != csDone && f.err == nil {
		if f.st == csData {
			n := min(uint64(len(p)-i), f.left)
			f.data(p[i : i+int(n)])
			f.left -= n
			i += int(n)
			if f.left == 0 {
				f.st = csDataCR
			}
			continue
		}
		f.step(p[i])
		if f.err != nil {
			break // the failing byte is not the body's
		}
		if f.st == csSize || f.st == csSizeWS || f.st == csExt || f.st == csTrailerLine {
			if f.lineLen++; f.lineLen > maxLine {
				f.fail("chunk size or trailer line too long")
				break
			}
		}
		i++
	}
	f.seen += int64(i)
	return i
}

// step moves the chunk grammar past one byte outside chunk data.
func (f *BodyFraming) step(c byte) {
	switch f.st {
	case csSize:
		f.sizeByte(c)
	case csSizeWS:
		switch c {
		case ' ', '\t':
		case ';':
			f.st = csExt
		case '\r':
			f.st = csSizeLF
		default:
			f.fail(fmt.Sprintf("byte %q after a chunk size", c))
		}
	case csExt:
		f.lineByte(c, csSizeLF, "bare LF in a chunk extension")
	case csSizeLF:
		if f.expect(c, '\n', "chunk size line not ended by CRLF") {
			f.digits, f.lineLen = 0, 0
			f.st = csData
			if f.left == 0 {
				f.st = csTrailer
			}
		}
	case csDataCR:
		if f.expect(c, '\r', "chunk data not followed by CRLF") {
			f.st = csDataLF
		}
	case csDataLF:
		if f.expect(c, '\n', "chunk data not followed by CRLF") {
			f.st = csSize
		}
	case csTrailer:
		if c == '\r' {
			f.st = csFinalLF
			return
		}
		f.st = csTrailerLine
		f.lineByte(c, csTrailerLF, "bare LF in a trailer line")
	case csTrailerLine:
		f.lineByte(c, csTrailerLF, "bare LF in a trailer line")
	case csTrailerLF:
		if f.expect(c, '\n', "trailer line not ended by CRLF") {
			f.lineLen = 0
			f.st = csTrailer
		}
	case csFinalLF:
		if f.expect(c, '\n', "chunked body not ended by CRLF") {
			f.st = csDone
		}
	}
}

// sizeByte takes one byte of a chunk-size line's hex size.
func (f *BodyFraming) sizeByte(c byte) {
	switch v := hexVal(c); {
	case v >= 0:
		if f.digits++; f.digits > 15 {
			f.fail("chunk size too large")
			return
		}
		f.left = f.left<<4 | uint64(v)
	case f.digits == 0:
		f.fail(fmt.Sprintf("byte %q in a chunk size", c))
	case c == ';':
		f.st = csExt
	case c == ' ' || c == '\t':
		f.st = csSizeWS
	case c == '\r':
		f.st = csSizeLF
	default:
		f.fail(fmt.Sprintf("byte %q in a chunk size", c))
	}
}

// lineByte takes one byte of an extension or trailer line: CR moves to
// next, a bare LF is malformed, anything else stays in the line.
func (f *BodyFraming) lineByte(c byte, next chunkState, bareLF string) {
	switch c {
	case '\r':
		f.st = next
	case '\n':
		f.fail(bareLF)
	}
}

// expect checks that c is want, failing the framing with why otherwise.
func (f *BodyFraming) expect(c, want byte, why string) bool {
	if c != want {
		f.fail(why)
		return false
	}
	return true
}

func (f *BodyFraming) data(p []byte) {
	if len(p) >= 2 {
		f.last = [2]byte{p[len(p)-2], p[len(p)-1]}
	} else if len(p) == 1 {
		f.last = [2]byte{f.last[1], p[0]}
	}
	f.nData += int64(len(p))
	if f.payload != nil && len(p) > 0 {
		f.payload(p)
	}
}

func (f *BodyFraming) fail(why string) { f.err = fmt.Errorf("%w: %s", ErrBadFraming, why) }

func hexVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// Complete reports whether the body has ended by its own framing. A body
// delimited by the connection's close is never complete by framing: its
// end is the backend's EOF.
func (f *BodyFraming) Complete() bool {
	if f.chunked && f.skipped {
		return f.judged.complete
	}
	if f.chunked {
		return f.st == csDone
	}
	return f.length >= 0 && f.seen >= f.length
}

// Delimited reports whether the body carries its own end (chunked or a
// declared length), so that an EOF before it is a broken response.
func (f *BodyFraming) Delimited() bool { return f.chunked || f.length >= 0 }

// Err is the framing error that stopped Feed, if any.
func (f *BodyFraming) Err() error { return f.err }

// Seen is the number of body bytes accepted.
func (f *BodyFraming) Seen() int64 { return f.seen }

// AtEventBoundary reports whether the body stopped between two chunks whose
// data so far ended a server-sent event ("\n\n"), so a well-formed chunk
// carrying one more event can follow.
func (f *BodyFraming) AtEventBoundary() bool {
	if f.skipped {
		return f.chunked && f.judged.boundary
	}
	return f.chunked && f.err == nil && f.st == csSize && f.digits == 0 &&
		(f.nData == 0 || f.last == [2]byte{'\n', '\n'})
}

// Skip implements datapath.BodyEnd: n body bytes moved in the kernel. A
// Content-Length body counts them; a chunked body is judged from its last
// bytes alone (tailEnds), as the kernel leg sees only what the BPF program
// kept of the stream's end.
func (f *BodyFraming) Skip(n int64, tail []byte, whole bool) {
	f.seen += n
	f.skipped = true
	if f.chunked {
		f.judged.complete, f.judged.boundary = tailEnds(tail, whole)
	}
}

// State implements datapath.BodyEnd.
func (f *BodyFraming) State() datapath.BodyState {
	return datapath.BodyState{Complete: f.Complete(), Delimited: f.Delimited(), Seen: f.seen, Err: f.err}
}

// BrokenEnd implements datapath.BodyEnd: an event stream the backend broke
// at an event boundary ends with one more well-formed chunk, an error event
// carrying why (sseErrorEvent); anywhere else nothing can follow cleanly.
func (f *BodyFraming) BrokenEnd(why string) []byte {
	if !f.eventStream || f.Complete() || !f.AtEventBoundary() {
		return nil
	}
	return sseErrorEvent(why)
}

// tailEnds judges a chunked body from its last bytes alone, for the kernel
// leg, which sees only what the BPF program kept of the stream's end
// (whole: tail is the entire body). complete: the tail ends with a last
// chunk, trailers and the final CRLF. boundary: the tail ends a chunk whose
// data ended a server-sent event. The judgement can be fooled by chunk data
// that itself ends in "\r\n0\r\n", which no SSE or JSON body does; see
// docs/body-leg.md.
func tailEnds(tail []byte, whole bool) (complete, boundary bool) {
	boundary = bytes.HasSuffix(tail, []byte("\n\n\r\n"))
	if !bytes.HasSuffix(tail, []byte("\r\n")) || len(tail) < 5 {
		return false, boundary
	}
	// t ends with the CRLF of the line before the final CRLF: a trailer or
	// the last-chunk line "0[;ext]". Walk back over trailers to it.
	t := tail[:len(tail)-2]
	if !bytes.HasSuffix(t, []byte("\r\n")) {
		return false, boundary
	}
	for trailers := 0; ; trailers++ {
		inner := t[:len(t)-2]
		k := bytes.LastIndex(inner, []byte("\r\n"))
		if k < 0 && !whole {
			// Trailers longer than the tail (enginesim sends one):
			// nothing here shows a cut, so the body is taken as complete.
			return trailers > 0 || bytes.IndexByte(inner, ':') > 0, false
		}
		line := inner
		if k >= 0 {
			line = inner[k+2:]
		}
		if isLastChunkLine(line) {
			return true, false
		}
		if k < 0 || bytes.IndexByte(line, ':') <= 0 {
			return false, boundary
		}
		t = inner[:k+2]
	}
}

func isLastChunkLine(l []byte) bool {
	if i := bytes.IndexByte(l, ';'); i >= 0 {
		l = l[:i]
	}
	l = bytes.TrimRight(l, " \t")
	if len(l) == 0 {
		return false
	}
	for _, c := range l {
		if c != '0' {
			return false
		}
	}
	return true
}

// sseErrorEvent is the chunk a leg sends to an SSE client when the backend
// broke the stream at an event boundary: OpenAI's SDKs raise an APIError
// carrying this message on a data event with an "error" member, instead of
// a bare socket error (docs/body-leg.md, "Broken responses").
func sseErrorEvent(message string) []byte {
	ev := fmt.Sprintf(`data: {"error":{"message":%q,"type":"server_error","param":null,"code":"backend_broken"}}`+"\n\n", message)
	return fmt.Appendf(nil, "%x\r\n%s\r\n", len(ev), ev)
}

// Payload removes a response body's HTTP framing for a reader of its
// content (the usage audit, docs/parity.md): it takes the body's bytes as
// they go to the client and hands sink the payload alone, chunk data
// without sizes, extensions or trailers, and nothing past the body's end.
// A framing error stops the payload; the body leg reports the error itself.
type Payload struct {
	f    BodyFraming
	sink func([]byte)
}

// NewPayload follows a body framed as NewBodyFraming's arguments say.
func NewPayload(chunked bool, contentLength int64, sink func([]byte)) *Payload {
	p := &Payload{f: *NewBodyFraming(chunked, contentLength, false), sink: sink}
	if chunked {
		p.f.payload = sink
	}
	return p
}

// Write takes the next body bytes in wire form; sink must not keep them.
func (p *Payload) Write(b []byte) {
	n := p.f.Feed(b)
	if !p.f.chunked && n > 0 {
		p.sink(b[:n])
	}
}

// Err is the framing error that stopped the payload, if any.
func (p *Payload) Err() error { return p.f.Err() }
