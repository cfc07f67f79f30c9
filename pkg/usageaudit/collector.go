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
)

func (o Outcome) String() string {
	switch o {
	case Found:
		return "found"
	case NoUsage:
		return "no_usage"
	case TooLarge:
		return "too_large"
	}
	return "unknown"
}

// DefaultMaxBytes bounds what a Collector keeps: a JSON body, or one SSE
// line. A vLLM completion's usage event is a few hundred bytes; a
// non-streamed body is its generated text plus ~300 bytes.
const DefaultMaxBytes = 256 << 10

// Collector receives a response body's payload as it is relayed (the
// proxy removes the HTTP framing first; docs/parity.md, "Per-request usage
// audit"), and keeps only what the usage needs: the JSON body up to a
// bound, or the stream's last data event. Not safe for concurrent use; one
// per response.
type Collector struct {
	kind Kind
	max  int

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

// NewCollector returns a collector for a body of kind; maxBytes ≤ 0 means
// DefaultMaxBytes.
func NewCollector(kind Kind, maxBytes int) *Collector {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	return &Collector{kind: kind, max: maxBytes}
}

// Write takes the next bytes of the body's payload. It never fails and
// keeps at most about twice its bound.
func (c *Collector) Write(p []byte) {
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
