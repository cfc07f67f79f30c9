package chattemplate

import (
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxSkipDepth is the nesting JSONReader.Skip accepts: encoding/json's
// limit, so a body it calls valid is valid here too.
const MaxSkipDepth = 10000

// JSONReader reads JSON values from one byte slice in a single pass, without
// the token-by-token copies of encoding/json's Decoder. Value gives exactly
// what DecodeJSON gives (the types and key order of Python's json.loads),
// Skip validates a value as strictly as encoding/json does, and the caller
// can read an object's members or an array's elements one at a time, which
// lets a request body be validated and its messages decoded in the same
// pass (docs/tokenizer.md, "Decision cost at long context"). Strings are
// unquoted as encoding/json unquotes them: invalid UTF-8 and unpaired
// surrogate escapes become U+FFFD.
type JSONReader struct {
	data []byte
	pos  int
}

// JSONSyntaxError is a malformed JSON input at Offset.
type JSONSyntaxError struct {
	Offset int
	Msg    string
}

func (e *JSONSyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.Offset, e.Msg)
}

// errTooDeep is Value's nesting bound (maxInputDepth, as DecodeJSON).
var errTooDeep = errors.New("nesting too deep")

// NewJSONReader reads data from its start.
func NewJSONReader(data []byte) *JSONReader { return &JSONReader{data: data} }

// Offset is the position of the next unread byte.
func (r *JSONReader) Offset() int { return r.pos }

// Seek moves to off (an offset the reader returned before, or the start of a
// value whose bytes the caller verified).
func (r *JSONReader) Seek(off int) { r.pos = off }

// Data is the input.
func (r *JSONReader) Data() []byte { return r.data }

func (r *JSONReader) fail(msg string) error { return &JSONSyntaxError{Offset: r.pos, Msg: msg} }

// SkipSpace moves past JSON whitespace and returns the next byte, or 0 at
// the end of the input.
func (r *JSONReader) SkipSpace() byte {
	for r.pos < len(r.data) {
		switch c := r.data[r.pos]; c {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return c
		}
	}
	return 0
}

// Consume reads the byte c after optional whitespace.
func (r *JSONReader) Consume(c byte) error {
	if r.SkipSpace() != c || r.pos >= len(r.data) {
		return r.fail(fmt.Sprintf("expected %q", c))
	}
	r.pos++
	return nil
}

// Next reads, after optional whitespace, the separator that follows an
// element of an object (end '}') or an array (end ']'): more is true after
// a ',', false after end.
func (r *JSONReader) Next(end byte) (more bool, err error) {
	switch r.SkipSpace() {
	case ',':
		r.pos++
		return true, nil
	case end:
		r.pos++
		return false, nil
	}
	return false, r.fail(fmt.Sprintf("expected ',' or %q", end))
}

// Open reads the '{' or '[' that starts a container and reports whether it
// is empty (its closing byte is consumed then).
func (r *JSONReader) Open(open, end byte) (empty bool, err error) {
	if err := r.Consume(open); err != nil {
		return false, err
	}
	if r.SkipSpace() == end && r.pos < len(r.data) {
		r.pos++
		return true, nil
	}
	return false, nil
}

// Key reads an object member's key and the ':' after it.
func (r *JSONReader) Key() (string, error) {
	if r.SkipSpace() != '"' {
		return "", r.fail("expected a string key")
	}
	k, err := r.String()
	if err != nil {
		return "", err
	}
	return k, r.Consume(':')
}

// End reports an error unless only whitespace is left.
func (r *JSONReader) End() error {
	if r.SkipSpace(); r.pos < len(r.data) {
		return r.fail("data after the value")
	}
	return nil
}

// String reads a string value (the reader is at its opening quote).
func (r *JSONReader) String() (string, error) {
	start := r.pos + 1
	high := false
	for i := start; i < len(r.data); i++ {
		switch c := r.data[i]; {
		case c == '"':
			s := r.data[start:i]
			if high && !utf8.Valid(s) {
				return r.slowString(start, start)
			}
			r.pos = i + 1
			return string(s), nil
		case c == '\\':
			if high && !utf8.Valid(r.data[start:i]) {
				return r.slowString(start, start)
			}
			return r.slowString(start, i)
		case c < 0x20:
			r.pos = i
			return "", r.fail("control character in string")
		case c >= utf8.RuneSelf:
			high = true
		}
	}
	r.pos = len(r.data)
	return "", r.fail("unterminated string")
}

// slowString unquotes a string with escapes or invalid UTF-8 from start
// (just after its opening quote), as encoding/json's unquote does; the
// bytes from start to plain are valid UTF-8 without escapes.
func (r *JSONReader) slowString(start, plain int) (string, error) {
	size := plain - start + 64
	if end := closingQuote(r.data, plain); end >= 0 {
		size = end - start // unquoting only shrinks, but for U+FFFD replacements
	}
	out := append(make([]byte, 0, size), r.data[start:plain]...)
	i := plain
	for i < len(r.data) {
		c := r.data[i]
		switch {
		case c == '"':
			r.pos = i + 1
			return string(out), nil
		case c == '\\':
			var err error
			if out, i, err = r.escape(out, i); err != nil {
				return "", err
			}
		case c < 0x20:
			r.pos = i
			return "", r.fail("control character in string")
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			rr, size := utf8.DecodeRune(r.data[i:])
			out = utf8.AppendRune(out, rr)
			i += size
		}
	}
	r.pos = len(r.data)
	return "", r.fail("unterminated string")
}

// escape appends the escape sequence at i (a backslash) and returns the
// offset after it. A surrogate pair decodes to one rune; a lone surrogate is
// U+FFFD and the escape after it is read on its own, as encoding/json does.
func (r *JSONReader) escape(out []byte, i int) ([]byte, int, error) {
	if i+1 >= len(r.data) {
		r.pos = i
		return nil, 0, r.fail("unterminated escape")
	}
	switch e := r.data[i+1]; e {
	case '"', '\\', '/':
		return append(out, e), i + 2, nil
	case 'b':
		return append(out, '\b'), i + 2, nil
	case 'f':
		return append(out, '\f'), i + 2, nil
	case 'n':
		return append(out, '\n'), i + 2, nil
	case 'r':
		return append(out, '\r'), i + 2, nil
	case 't':
		return append(out, '\t'), i + 2, nil
	case 'u':
		rr, ok := hex4(r.data, i+2)
		if !ok {
			r.pos = i
			return nil, 0, r.fail("bad \\u escape")
		}
		i += 6
		if utf16.IsSurrogate(rr) {
			if lo, ok := lowSurrogate(r.data, i); ok {
				if dec := utf16.DecodeRune(rr, lo); dec != utf8.RuneError {
					return utf8.AppendRune(out, dec), i + 6, nil
				}
			}
			rr = utf8.RuneError
		}
		return utf8.AppendRune(out, rr), i, nil
	}
	r.pos = i
	return nil, 0, r.fail("bad escape")
}

// closingQuote is the offset of the quote that ends a string whose
// unread part starts at i, or -1.
func closingQuote(data []byte, i int) int {
	for ; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// lowSurrogate reads a \uXXXX escape at i, if there is one.
func lowSurrogate(data []byte, i int) (rune, bool) {
	if i+1 >= len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return 0, false
	}
	return hex4(data, i+2)
}

func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var v rune
	for _, c := range data[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | rune(c)
	}
	return v, true
}

// number reads a number literal with JSON's grammar and returns its text.
func (r *JSONReader) number() ([]byte, error) {
	d, start := r.data, r.pos
	i := start
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && '1' <= d[i] && d[i] <= '9':
		i = digits(d, i)
	default:
		r.pos = i
		return nil, r.fail("bad number")
	}
	if i < len(d) && d[i] == '.' {
		j := digits(d, i+1)
		if j == i+1 {
			r.pos = j
			return nil, r.fail("bad number fraction")
		}
		i = j
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := digits(d, i)
		if j == i {
			r.pos = j
			return nil, r.fail("bad number exponent")
		}
		i = j
	}
	r.pos = i
	return d[start:i], nil
}

func digits(d []byte, i int) int {
	for i < len(d) && '0' <= d[i] && d[i] <= '9' {
		i++
	}
	return i
}

// literal reads true, false or null.
func (r *JSONReader) literal() (any, error) {
	for _, l := range [...]struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if len(r.data)-r.pos >= len(l.text) && string(r.data[r.pos:r.pos+len(l.text)]) == l.text {
			r.pos += len(l.text)
			return l.v, nil
		}
	}
	return nil, r.fail("unexpected byte")
}

// Value decodes one value as DecodeJSON does; depth is the value's nesting
// (0 for a top-level value) and is bounded as DecodeJSON bounds it.
func (r *JSONReader) Value(depth int) (any, error) {
	if depth > maxInputDepth {
		return nil, errTooDeep
	}
	switch r.SkipSpace() {
	case '{':
		return r.object(depth)
	case '[':
		return r.array(depth)
	case '"':
		return r.String()
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		lit, err := r.number()
		if err != nil {
			return nil, err
		}
		return numberValue(string(lit))
	}
	return r.literal()
}

func (r *JSONReader) object(depth int) (any, error) {
	empty, err := r.Open('{', '}')
	if err != nil || empty {
		return NewDict(), err
	}
	d := NewDict()
	for {
		k, err := r.Key()
		if err != nil {
			return nil, err
		}
		v, err := r.Value(depth + 1)
		if err != nil {
			return nil, err
		}
		d.Set(k, v)
		if more, err := r.Next('}'); err != nil || !more {
			return d, err
		}
	}
}

func (r *JSONReader) array(depth int) (any, error) {
	list := []any{}
	empty, err := r.Open('[', ']')
	if err != nil || empty {
		return list, err
	}
	for {
		v, err := r.Value(depth + 1)
		if err != nil {
			return nil, err
		}
		list = append(list, v)
		if more, err := r.Next(']'); err != nil || !more {
			return list, err
		}
	}
}

// Skip validates one value and moves past it, building nothing. Nesting
// counts from 1 for a top-level container, up to MaxSkipDepth.
func (r *JSONReader) Skip(depth int) error {
	switch r.SkipSpace() {
	case '{', '[':
		return r.skipContainer(depth + 1)
	case '"':
		return r.skipString()
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		_, err := r.number()
		return err
	}
	_, err := r.literal()
	return err
}

func (r *JSONReader) skipContainer(depth int) error {
	if depth > MaxSkipDepth {
		return r.fail("exceeded max depth")
	}
	open := r.data[r.pos]
	end := byte(']')
	if open == '{' {
		end = '}'
	}
	empty, err := r.Open(open, end)
	if err != nil || empty {
		return err
	}
	for {
		if open == '{' {
			if err := r.skipKey(); err != nil {
				return err
			}
		}
		if err := r.Skip(depth); err != nil {
			return err
		}
		if more, err := r.Next(end); err != nil || !more {
			return err
		}
	}
}

func (r *JSONReader) skipKey() error {
	if r.SkipSpace() != '"' {
		return r.fail("expected a string key")
	}
	if err := r.skipString(); err != nil {
		return err
	}
	return r.Consume(':')
}

// skipString validates a string (the reader is at its opening quote).
func (r *JSONReader) skipString() error {
	for i := r.pos + 1; i < len(r.data); i++ {
		switch c := r.data[i]; {
		case c == '"':
			r.pos = i + 1
			return nil
		case c == '\\':
			if i+1 >= len(r.data) {
				r.pos = i
				return r.fail("unterminated escape")
			}
			switch r.data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if _, ok := hex4(r.data, i+2); !ok {
					r.pos = i
					return r.fail("bad \\u escape")
				}
				i += 5
			default:
				r.pos = i
				return r.fail("bad escape")
			}
		case c < 0x20:
			r.pos = i
			return r.fail("control character in string")
		}
	}
	r.pos = len(r.data)
	return r.fail("unterminated string")
}

// ObjectMap decodes an object value straight into a map, as DecodeMessages
// gives a message (a repeated key keeps its last value); its nested values
// are Value's. ok is false, with nothing read, when the next value is not an
// object. depth is the object's nesting, bounded as in Value.
func (r *JSONReader) ObjectMap(depth int) (m map[string]any, ok bool, err error) {
	if r.SkipSpace() != '{' {
		return nil, false, nil
	}
	if depth > maxInputDepth {
		return nil, true, errTooDeep
	}
	m = make(map[string]any, 4)
	empty, err := r.Open('{', '}')
	if err != nil || empty {
		return m, true, err
	}
	for {
		k, err := r.Key()
		if err != nil {
			return nil, true, err
		}
		v, err := r.Value(depth + 1)
		if err != nil {
			return nil, true, err
		}
		m[k] = v
		if more, err := r.Next('}'); err != nil || !more {
			return m, true, err
		}
	}
}
