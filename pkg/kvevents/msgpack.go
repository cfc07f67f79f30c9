package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// A minimal msgpack reader and writer for exactly what KV events use. The
// reader never copies: strings and bins are sub-slices of the payload.
// Every length is checked against the bytes left, so a hostile header cannot
// make the decoder allocate more than the payload's size.

// DecodeError reports malformed msgpack: where and why.
type DecodeError struct {
	Offset int
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("kvevents: malformed payload at byte %d: %s", e.Offset, e.Reason)
}

// msgpack type classes returned by reader.kind.
type kind uint8

const (
	kindInvalid kind = iota
	kindNil
	kindBool
	kindInt
	kindFloat
	kindStr
	kindBin
	kindArray
	kindMap
	kindExt
)

type reader struct {
	b   []byte
	off int
}

func (r *reader) fail(reason string) error { return &DecodeError{Offset: r.off, Reason: reason} }

func (r *reader) remaining() int { return len(r.b) - r.off }

// kind classifies the next value without consuming it.
func (r *reader) kind() kind {
	if r.off >= len(r.b) {
		return kindInvalid
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f || c >= 0xe0:
		return kindInt
	case c <= 0x8f:
		return kindMap
	case c <= 0x9f:
		return kindArray
	case c <= 0xbf:
		return kindStr
	}
	switch c {
	case 0xc0:
		return kindNil
	case 0xc2, 0xc3:
		return kindBool
	case 0xc4, 0xc5, 0xc6:
		return kindBin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return kindExt
	case 0xca, 0xcb:
		return kindFloat
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return kindInt
	case 0xd9, 0xda, 0xdb:
		return kindStr
	case 0xdc, 0xdd:
		return kindArray
	case 0xde, 0xdf:
		return kindMap
	}
	return kindInvalid // 0xc1 is never used
}

// need checks that n more bytes exist.
func (r *reader) need(n int) error {
	if n < 0 || r.remaining() < n {
		return r.fail("truncated")
	}
	return nil
}

// uintN reads an n-byte big-endian unsigned integer (n = 1, 2, 4, 8).
func (r *reader) uintN(n int) (uint64, error) {
	if err := r.need(n); err != nil {
		return 0, err
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// readNil consumes a nil if one is next and reports whether it did.
func (r *reader) readNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// readInt reads any msgpack integer. bits holds its 64 bits (two's
// complement for negatives); neg reports a negative value.
func (r *reader) readInt() (bits uint64, neg bool, err error) {
	if err := r.need(1); err != nil {
		return 0, false, err
	}
	c := r.b[r.off]
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	r.off++
	var v uint64
	switch c {
	case 0xcc:
		v, err = r.uintN(1)
		return v, false, err
	case 0xcd:
		v, err = r.uintN(2)
		return v, false, err
	case 0xce:
		v, err = r.uintN(4)
		return v, false, err
	case 0xcf:
		v, err = r.uintN(8)
		return v, false, err
	case 0xd0:
		v, err = r.uintN(1)
		s := int64(int8(v))
		return uint64(s), s < 0, err
	case 0xd1:
		v, err = r.uintN(2)
		s := int64(int16(v))
		return uint64(s), s < 0, err
	case 0xd2:
		v, err = r.uintN(4)
		s := int64(int32(v))
		return uint64(s), s < 0, err
	case 0xd3:
		v, err = r.uintN(8)
		return v, int64(v) < 0, err
	}
	r.off--
	return 0, false, r.fail("not an integer")
}

// readFloat reads a float32/float64, or an integer as a float.
func (r *reader) readFloat() (float64, error) {
	if err := r.need(1); err != nil {
		return 0, err
	}
	switch r.b[r.off] {
	case 0xca:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	if r.kind() == kindInt {
		bits, neg, err := r.readInt()
		if neg {
			return float64(int64(bits)), err
		}
		return float64(bits), err
	}
	return 0, r.fail("not a number")
}

// readBytes reads a str or bin value and returns its payload (not copied).
func (r *reader) readBytes() ([]byte, error) {
	if err := r.need(1); err != nil {
		return nil, err
	}
	c := r.b[r.off]
	var n uint64
	var err error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		r.off++
		n, err = r.uintN(1)
	case c == 0xda || c == 0xc5:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdb || c == 0xc6:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, r.fail("not a string or bytes")
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.remaining()) {
		return nil, r.fail("string or bytes longer than the payload")
	}
	p := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return p, nil
}

// readArrayLen reads an array header. The count is bounded by the bytes
// left (every element takes at least one byte).
func (r *reader) readArrayLen() (int, error) {
	if err := r.need(1); err != nil {
		return 0, err
	}
	c := r.b[r.off]
	var n uint64
	var err error
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xdc:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdd:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, r.fail("not an array")
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.remaining()) {
		return 0, r.fail("array count exceeds the payload")
	}
	return int(n), nil
}

// readMapLen reads a map header; the pair count is bounded by the bytes left.
func (r *reader) readMapLen() (int, error) {
	if err := r.need(1); err != nil {
		return 0, err
	}
	c := r.b[r.off]
	var n uint64
	var err error
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xde:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdf:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, r.fail("not a map")
	}
	if err != nil {
		return 0, err
	}
	if n*2 > uint64(r.remaining()) {
		return 0, r.fail("map count exceeds the payload")
	}
	return int(n), nil
}

// skip consumes one complete value of any type, iteratively (no recursion,
// so deep nesting cannot exhaust the stack).
func (r *reader) skip() error {
	pending := 1
	for pending > 0 {
		pending--
		if err := r.need(1); err != nil {
			return err
		}
		c := r.b[r.off]
		var size uint64 // payload bytes to jump over after the head
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			r.off++
		case c <= 0x8f || c == 0xde || c == 0xdf:
			var n int
			if n, err = r.readMapLen(); err == nil {
				pending += 2 * n
			}
		case c <= 0x9f || c == 0xdc || c == 0xdd:
			var n int
			if n, err = r.readArrayLen(); err == nil {
				pending += n
			}
		case c <= 0xbf || c == 0xd9 || c == 0xda || c == 0xdb || c == 0xc4 || c == 0xc5 || c == 0xc6:
			_, err = r.readBytes()
		case c == 0xca:
			r.off++
			size = 4
		case c == 0xcb:
			r.off++
			size = 8
		case c >= 0xcc && c <= 0xd3:
			_, _, err = r.readInt()
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type byte + data
			r.off++
			size = 1 + 1<<(c-0xd4)
		case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext 8/16/32: length, type, data
			r.off++
			var n uint64
			if n, err = r.uintN(1 << (c - 0xc7)); err == nil {
				size = n + 1
			}
		default:
			return r.fail("invalid type byte 0xc1")
		}
		if err != nil {
			return err
		}
		if size > uint64(r.remaining()) {
			return r.fail("truncated")
		}
		r.off += int(size)
		if pending > r.remaining() {
			return r.fail("element count exceeds the payload")
		}
	}
	return nil
}

// Writer helpers, emitting the shortest forms as msgspec does.

func appendArrayHead(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= 0xffff:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapHead(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= 0xffff:
		return append(dst, 0xde, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= 0xff:
		dst = append(dst, 0xd9, byte(n))
	case n <= 0xffff:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, b []byte) []byte {
	n := len(b)
	switch {
	case n <= 0xff:
		dst = append(dst, 0xc4, byte(n))
	case n <= 0xffff:
		dst = append(dst, 0xc5, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, b...)
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= 0xff:
		return append(dst, 0xcc, byte(v))
	case v <= 0xffff:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(dst, uint64(v))
	}
	switch {
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(dst, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}

func appendNil(dst []byte) []byte { return append(dst, 0xc0) }
