package sglang

import (
	"encoding/binary"
	"fmt"
	"math"
)

// A small msgpack reader for the SGLang payload. pkg/kvevents keeps its own
// reader unexported (it is tuned to vLLM's layouts), so this package carries
// the few primitives it needs. Every length is checked against the bytes
// left before anything is allocated.

// maxDepth bounds nesting when skipping values nobody reads.
const maxDepth = 32

type reader struct {
	b   []byte
	off int
}

func (r *reader) errf(format string, args ...any) error {
	return &DecodeError{Offset: r.off, Reason: fmt.Sprintf(format, args...)}
}

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.errf("truncated")
	}
	return r.b[r.off], nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || len(r.b)-r.off < n {
		return nil, r.errf("truncated: need %d bytes", n)
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) uintN(n int) (uint64, error) {
	p, err := r.take(n)
	if err != nil {
		return 0, err
	}
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

// nilNext consumes a nil if one is next.
func (r *reader) nilNext() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// isInt, isStr, isArray, isMap classify the next value without consuming it.
func (r *reader) isInt() bool {
	c, err := r.peek()
	return err == nil && (c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3))
}

func (r *reader) isArray() bool {
	c, err := r.peek()
	return err == nil && ((c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd)
}

func (r *reader) isMap() bool {
	c, err := r.peek()
	return err == nil && ((c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf)
}

func (r *reader) isStr() bool {
	c, err := r.peek()
	return err == nil && ((c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb))
}

// readInt reads any msgpack integer as its 64-bit pattern. neg reports a
// negative signed value; a uint64 above MaxInt64 is not negative.
func (r *reader) readInt() (bits uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	r.off++
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		v, err := r.uintN(1 << (c - 0xcc))
		return v, false, err
	case 0xd0, 0xd1, 0xd2, 0xd3:
		n := 1 << (c - 0xd0)
		v, err := r.uintN(n)
		if err != nil {
			return 0, false, err
		}
		var s int64
		switch n {
		case 1:
			s = int64(int8(v))
		case 2:
			s = int64(int16(v))
		case 4:
			s = int64(int32(v))
		default:
			s = int64(v)
		}
		return uint64(s), s < 0, nil
	}
	r.off--
	return 0, false, r.errf("want an integer, got 0x%02x", c)
}

func (r *reader) readFloat() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	if r.isInt() {
		v, neg, err := r.readInt()
		if neg {
			return float64(int64(v)), err
		}
		return float64(v), err
	}
	return 0, r.errf("want a float, got 0x%02x", c)
}

func (r *reader) readStr() (string, error) {
	c, err := r.peek()
	if err != nil {
		return "", err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c >= 0xd9 && c <= 0xdb:
		r.off++
		if n, err = r.uintN(1 << (c - 0xd9)); err != nil {
			return "", err
		}
	default:
		return "", r.errf("want a string, got 0x%02x", c)
	}
	if n > uint64(len(r.b)-r.off) {
		return "", r.errf("string of %d bytes overruns the payload", n)
	}
	p, _ := r.take(int(n))
	return string(p), nil
}

// containerLen reads an array (isMap false) or map head. Each element needs
// at least one byte (two per map entry), so a length beyond the remaining
// bytes is malformed and never allocates.
func (r *reader) containerLen(isMap bool) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case !isMap && c >= 0x90 && c <= 0x9f:
		r.off++
		n = uint64(c & 0x0f)
	case isMap && c >= 0x80 && c <= 0x8f:
		r.off++
		n = uint64(c & 0x0f)
	case !isMap && (c == 0xdc || c == 0xdd):
		r.off++
		if n, err = r.uintN(2 << (c - 0xdc)); err != nil {
			return 0, err
		}
	case isMap && (c == 0xde || c == 0xdf):
		r.off++
		if n, err = r.uintN(2 << (c - 0xde)); err != nil {
			return 0, err
		}
	default:
		if isMap {
			return 0, r.errf("want a map, got 0x%02x", c)
		}
		return 0, r.errf("want an array, got 0x%02x", c)
	}
	per := uint64(1)
	if isMap {
		per = 2
	}
	if n > uint64(len(r.b)-r.off)/per {
		return 0, r.errf("container of %d elements overruns the payload", n)
	}
	return int(n), nil
}

func (r *reader) arrayLen() (int, error) { return r.containerLen(false) }
func (r *reader) mapLen() (int, error)   { return r.containerLen(true) }

// skip consumes one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return r.errf("nested deeper than %d", maxDepth)
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case r.isInt():
		_, _, err := r.readInt()
		return err
	case r.isStr():
		_, err := r.readStr()
		return err
	case r.isArray(), r.isMap():
		m := r.isMap()
		n, err := r.containerLen(m)
		if err != nil {
			return err
		}
		if m {
			n *= 2
		}
		for i := 0; i < n; i++ {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	r.off++
	var n uint64
	switch c {
	case 0xc0, 0xc2, 0xc3:
		return nil
	case 0xca:
		_, err = r.take(4)
		return err
	case 0xcb:
		_, err = r.take(8)
		return err
	case 0xc4, 0xc5, 0xc6:
		if n, err = r.uintN(1 << (c - 0xc4)); err != nil {
			return err
		}
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		n = 1 + 1<<(c-0xd4)
	case 0xc7, 0xc8, 0xc9:
		if n, err = r.uintN(1 << (c - 0xc7)); err != nil {
			return err
		}
		n++
	default:
		r.off--
		return r.errf("invalid msgpack byte 0x%02x", c)
	}
	if n > uint64(len(r.b)-r.off) {
		return r.errf("value of %d bytes overruns the payload", n)
	}
	r.off += int(n)
	return nil
}
