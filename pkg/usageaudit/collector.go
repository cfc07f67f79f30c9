package usageaudit

import "bytes"

// Kind is how a response body carries its usage.
type Kind uint8

const (
	// KindJSON: one JSON document (a non-streamed completion); usage is a
	// top-level field.
	KindJSON Kind = iota
	// KindEventStream: text/event-stream; the last data event that names
	// "usage" carries the final one (chat and completions with
	// stream_options.include_usage: the event before "[DONE]"; Responses:
	// response.completed; Messages: message_delta, before message_stop).
	KindEventStream
)

// Outcome says what a collected body gave.
type Outcome uint8

const (
	// Found: the body reported usage.prompt_tokens.
	Found Outcome = iota
	// NoUsage: the body parsed as far as kvgate reads it but reported no
	// usage (a stream without include_usage, an error body, not JSON).
	NoUsage
	// TooLarge: the JSON body, or the stream's last data event, was above
	// the collector's bound.
	TooLarge
	// BadFraming: the chunked framing did not decode (the body leg reports
	// the framing error itself; the audit only gives up).
	BadFraming
)

func (o Outcome) String() string {
	switch o {
	case Found:
		return "found"
	case NoUsage:
		return "no_usage"
	case TooLarge:
		return "too_large"
	case BadFraming:
		return "bad_framing"
	}
	return "unknown"
}

// DefaultMaxBytes bounds what a Collector keeps: a JSON body, or one SSE
// line. A vLLM completion's usage event is a few hundred bytes; a
// non-streamed body is its generated text plus ~300 bytes.
const DefaultMaxBytes = 256 << 10

// Collector receives a response body's bytes as they are relayed, in wire
// form (still chunked when the response is), and keeps only what the usage
// needs: the JSON body up to a bound, or the stream's last data event. Not
// safe for concurrent use; one per response.
type Collector struct {
	kind    Kind
	max     int
	chunked bool
	dc      dechunker

	// KindJSON: the body so far.
	body []byte
	// KindEventStream: the line being read, and the last complete data
	// payload (swapped with line, so a stream allocates two buffers).
	line     []byte
	last     []byte
	lastOver bool // the last data line was above the bound (dropped)
	lineOver bool // the current line is above the bound

	over bool // KindJSON: the body was above the bound
}

// NewCollector returns a collector for a body of kind; chunked says the wire
// bytes carry Transfer-Encoding: chunked framing; maxBytes ≤ 0 means
// DefaultMaxBytes.
func NewCollector(kind Kind, chunked bool, maxBytes int) *Collector {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	return &Collector{kind: kind, max: maxBytes, chunked: chunked}
}

// Write takes the next relayed body bytes. It never fails and keeps at most
// about twice its bound.
func (c *Collector) Write(p []byte) {
	if !c.chunked {
		c.feed(p)
		return
	}
	c.dc.decode(p, c.feed)
}

func (c *Collector) feed(p []byte) {
	if c.kind == KindJSON {
		if c.over {
			return
		}
		if len(c.body)+len(p) > c.max {
			c.over, c.body = true, nil
			return
		}
		c.body = append(c.body, p...)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.addLine(p)
			return
		}
		c.addLine(p[:i])
		c.endLine()
		p = p[i+1:]
	}
}

func (c *Collector) addLine(p []byte) {
	if c.lineOver {
		return
	}
	if len(c.line)+len(p) > c.max {
		c.lineOver, c.line = true, c.line[:0]
		return
	}
	c.line = append(c.line, p...)
}

// endLine keeps a finished "data:" line that names "usage" (a token event
// does not, unless its text is exactly the word, which then fails to parse
// as usage and is no worse than no event).
func (c *Collector) endLine() {
	line, over := c.line, c.lineOver
	c.lineOver = false
	line = bytes.TrimSuffix(line, []byte{'\r'})
	switch {
	case over:
		// An oversized line counts only if it was a data line; its start is
		// gone, so assume it was (a usage event is never this large, so the
		// audit gives up rather than read an older event as the last).
		c.lastOver, c.last = true, c.last[:0]
	case bytes.HasPrefix(line, []byte("data:")):
		payload := bytes.TrimPrefix(line[len("data:"):], []byte{' '})
		if bytes.Contains(payload, []byte(`"usage"`)) {
			n := copy(line, payload) // payload is a suffix of line: shift it down
			c.last, c.line = line[:n], c.last
			c.lastOver = false
		}
	}
	c.line = c.line[:0]
}

// Usage reports what the body gave once it has been relayed.
func (c *Collector) Usage() (Usage, Outcome) {
	if c.chunked && c.dc.bad {
		return Usage{}, BadFraming
	}
	var doc []byte
	switch c.kind {
	case KindJSON:
		if c.over {
			return Usage{}, TooLarge
		}
		doc = c.body
	default:
		if c.lastOver {
			return Usage{}, TooLarge
		}
		doc = c.last
	}
	u, ok := ParseJSON(doc)
	if !ok {
		return Usage{}, NoUsage
	}
	return u, Found
}

// dechunker undoes Transfer-Encoding: chunked on a byte stream fed in
// arbitrary pieces. The body leg validates the framing; this only has to
// follow valid framing and stop on anything else.
type dechunker struct {
	state   uint8
	size    uint64
	digits  int
	remains uint64
	bad     bool
}

const (
	chSize    = iota // hex digits of the chunk size
	chExt            // extensions or the size line's CR, up to LF
	chData           // chunk data
	chDataEnd        // the CRLF after chunk data
	chDone           // after the last chunk: trailers, ignored
)

// maxChunkDigits bounds a chunk-size line's hex digits (16: any uint64).
const maxChunkDigits = 16

func (d *dechunker) decode(p []byte, sink func([]byte)) {
	for len(p) > 0 && !d.bad && d.state != chDone {
		switch d.state {
		case chData:
			n := uint64(len(p))
			if n > d.remains {
				n = d.remains
			}
			sink(p[:n])
			p = p[n:]
			d.remains -= n
			if d.remains == 0 {
				d.state = chDataEnd
			}
			continue
		case chDataEnd:
			switch p[0] {
			case '\r':
			case '\n':
				d.state, d.size, d.digits = chSize, 0, 0
			default:
				d.bad = true
			}
		case chSize:
			d.sizeByte(p[0])
		case chExt:
			if p[0] == '\n' {
				d.endSizeLine()
			}
		}
		p = p[1:]
	}
}

func (d *dechunker) sizeByte(b byte) {
	var v byte
	switch {
	case b >= '0' && b <= '9':
		v = b - '0'
	case b >= 'a' && b <= 'f':
		v = b - 'a' + 10
	case b >= 'A' && b <= 'F':
		v = b - 'A' + 10
	case b == '\n':
		d.endSizeLine()
		return
	case d.digits > 0 && (b == ';' || b == ' ' || b == '\t' || b == '\r'):
		d.state = chExt
		return
	default:
		d.bad = true
		return
	}
	d.digits++
	if d.digits > maxChunkDigits {
		d.bad = true
		return
	}
	d.size = d.size<<4 | uint64(v)
}

func (d *dechunker) endSizeLine() {
	switch {
	case d.digits == 0:
		d.bad = true
	case d.size == 0:
		d.state = chDone
	default:
		d.state, d.remains = chData, d.size
	}
}
