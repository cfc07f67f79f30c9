package kvhash

import (
	"encoding/binary"
	"unicode/utf8"
)

// Hand-written pickle protocol 5 (what CPython's C pickler emits for
// pickle.dumps(obj, protocol=5)) for the values vLLM's default sha256 and
// xxhash algorithms hash: the block tuple (bytes, tuple[int], None|tuple[str])
// and the seed string. Checked byte for byte against CPython 3.11 in tests.
//
// What CPython does, and this writer copies:
//   - PROTO 5, then the body cut into FRAMEs. Before each object is saved the
//     current frame is closed if it already holds >= 64 KiB; a frame of fewer
//     than 4 bytes gets no FRAME header.
//   - A str or bytes payload of >= 64 KiB closes the frame and is written
//     outside any frame (its opcode header too); a new frame follows it.
//   - ints: BININT1 (0..0xff), BININT2 (..0xffff), BININT (signed 32-bit),
//     else LONG1 with minimal little-endian two's complement.
//   - tuples: EMPTY_TUPLE; TUPLE1..3 after the items; else MARK items TUPLE.
//     Every non-empty tuple, str and bytes is followed by MEMOIZE.
//   - Memo GETs: inside a block tuple an object can only repeat when the LoRA
//     name and cache_salt are the same Python object. CPython caches every
//     one-character string below U+0100, so equal strings of that kind repeat
//     (BINGET); longer equal strings are distinct objects in vLLM.

const (
	pkProto           = 0x80
	pkFrame           = 0x95
	pkStop            = '.'
	pkMark            = '('
	pkTuple           = 't'
	pkEmptyTuple      = ')'
	pkTuple1          = 0x85
	pkTuple2          = 0x86
	pkTuple3          = 0x87
	pkNone            = 'N'
	pkMemoize         = 0x94
	pkBinGet          = 'h'
	pkLongBinGet      = 'j'
	pkBinInt          = 'J'
	pkBinInt1         = 'K'
	pkBinInt2         = 'M'
	pkLong1           = 0x8a
	pkShortBinBytes   = 'C'
	pkBinBytes        = 'B'
	pkBinBytes8       = 0x8e
	pkShortBinUnicode = 0x8c
	pkBinUnicode      = 'X'
	pkBinUnicode8     = 0x8d

	pkFrameHeaderLen  = 9
	pkFrameSizeTarget = 64 * 1024
	pkFrameSizeMin    = 4
	// pkMaxIntLen is the longest encoding of a uint32 token (LONG1, 5 bytes).
	pkMaxIntLen = 7
)

// pickler accumulates one pickle in buf. frameStart is the offset of the
// open frame's reserved header, or -1 while no frame is open.
type pickler struct {
	buf        []byte
	frameStart int
	memo       int // number of MEMOIZE opcodes written: the next memo index
}

func (p *pickler) begin(dst []byte) {
	p.buf = dst[:0] // the caller's buffer, reused
	p.buf = append(p.buf, pkProto, 5)
	p.openFrame()
}

func (p *pickler) openFrame() {
	p.frameStart = len(p.buf)
	p.buf = append(p.buf, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
}

func (p *pickler) frameLen() int { return len(p.buf) - p.frameStart - pkFrameHeaderLen }

// closeFrame writes the open frame's header, or removes the reserved header
// when the frame is too small to carry one.
func (p *pickler) closeFrame() {
	if p.frameStart < 0 {
		return
	}
	n := p.frameLen()
	if n >= pkFrameSizeMin {
		binary.LittleEndian.PutUint64(p.buf[p.frameStart+1:], uint64(n))
	} else {
		copy(p.buf[p.frameStart:], p.buf[p.frameStart+pkFrameHeaderLen:])
		p.buf = p.buf[:len(p.buf)-pkFrameHeaderLen]
	}
	p.frameStart = -1
}

// boundary runs before each object is saved: CPython commits a frame that
// has reached the target size at that point.
func (p *pickler) boundary() {
	if p.frameLen() >= pkFrameSizeTarget {
		p.closeFrame()
		p.openFrame()
	}
}

// finish appends STOP, closes the last frame and returns the pickle.
func (p *pickler) finish() []byte {
	p.buf = append(p.buf, pkStop)
	p.closeFrame()
	return p.buf
}

// writeLarge writes an opcode header and a payload of >= 64 KiB outside any frame.
func (p *pickler) writeLarge(head []byte, payload string) {
	p.closeFrame()
	p.buf = append(p.buf, head...)
	p.buf = append(p.buf, payload...)
	p.openFrame()
}

func (p *pickler) saveBytes(b []byte) {
	p.boundary()
	n := len(b)
	switch {
	case n <= 0xff:
		p.buf = append(p.buf, pkShortBinBytes, byte(n))
		p.buf = append(p.buf, b...)
	case n >= pkFrameSizeTarget:
		var head [9]byte
		head[0] = pkBinBytes
		binary.LittleEndian.PutUint32(head[1:], uint32(n))
		hl := 5
		if uint64(n) > 0xffffffff {
			head[0] = pkBinBytes8
			binary.LittleEndian.PutUint64(head[1:], uint64(n))
			hl = 9
		}
		p.writeLarge(head[:hl], string(b))
	default:
		p.buf = append(p.buf, pkBinBytes)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(n))
		p.buf = append(p.buf, b...)
	}
	p.memoize()
}

func (p *pickler) memoize() {
	p.buf = append(p.buf, pkMemoize)
	p.memo++
}

// memoGet appends the opcode that fetches memo entry i.
func (p *pickler) memoGet(i int) {
	p.boundary()
	if i < 256 {
		p.buf = append(p.buf, pkBinGet, byte(i))
		return
	}
	p.buf = append(p.buf, pkLongBinGet)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(i))
}

// cpythonSingleton reports whether CPython represents s by a cached
// singleton object: a one-character string below U+0100.
func cpythonSingleton(s string) bool {
	r, size := utf8.DecodeRuneInString(s)
	return size == len(s) && r != utf8.RuneError && r < 0x100
}

func (p *pickler) saveStr(s string) {
	p.boundary()
	n := len(s)
	switch {
	case n < 256:
		p.buf = append(p.buf, pkShortBinUnicode, byte(n))
		p.buf = append(p.buf, s...)
	case n >= pkFrameSizeTarget:
		var head [9]byte
		head[0] = pkBinUnicode
		binary.LittleEndian.PutUint32(head[1:], uint32(n))
		hl := 5
		if uint64(n) > 0xffffffff {
			head[0] = pkBinUnicode8
			binary.LittleEndian.PutUint64(head[1:], uint64(n))
			hl = 9
		}
		p.writeLarge(head[:hl], s)
	default:
		p.buf = append(p.buf, pkBinUnicode)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(n))
		p.buf = append(p.buf, s...)
	}
	p.memoize()
}

// appendPickleInt appends a non-negative int below 2^32 the way save_long does.
func appendPickleInt(dst []byte, t uint32) []byte {
	switch {
	case t <= 0xff:
		return append(dst, pkBinInt1, byte(t))
	case t <= 0xffff:
		return append(dst, pkBinInt2, byte(t), byte(t>>8))
	case t <= 0x7fffffff:
		return append(dst, pkBinInt, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	default:
		// 2^31..2^32-1 needs a fifth byte so the sign bit stays clear.
		return append(dst, pkLong1, 5, byte(t), byte(t>>8), byte(t>>16), byte(t>>24), 0)
	}
}

func (p *pickler) saveTokens(tokens []uint32) {
	p.boundary()
	n := len(tokens)
	if n == 0 {
		p.buf = append(p.buf, pkEmptyTuple)
		return
	}
	if n > 3 {
		p.buf = append(p.buf, pkMark)
	}
	if p.frameLen()+n*pkMaxIntLen < pkFrameSizeTarget {
		// No frame boundary can fall inside: skip the per-item check.
		for _, t := range tokens {
			p.buf = appendPickleInt(p.buf, t)
		}
	} else {
		for _, t := range tokens {
			p.boundary()
			p.buf = appendPickleInt(p.buf, t)
		}
	}
	p.buf = append(p.buf, tupleOpcode(n))
	p.memoize()
}

func tupleOpcode(n int) byte {
	switch n {
	case 1:
		return pkTuple1
	case 2:
		return pkTuple2
	case 3:
		return pkTuple3
	}
	return pkTuple
}

func (p *pickler) saveExtra(lora, salt string) {
	p.boundary()
	n := 0
	if lora != "" {
		n++
	}
	if salt != "" {
		n++
	}
	if n == 0 {
		p.buf = append(p.buf, pkNone)
		return
	}
	loraMemo := -1
	if lora != "" {
		loraMemo = p.memo
		p.saveStr(lora)
	}
	if salt != "" {
		if salt == lora && cpythonSingleton(salt) {
			p.memoGet(loraMemo)
		} else {
			p.saveStr(salt)
		}
	}
	p.buf = append(p.buf, tupleOpcode(n))
	p.memoize()
}

// appendPickleBlock appends pickle.dumps((parent, tuple(tokens), extra_keys), protocol=5).
func appendPickleBlock(dst, parent []byte, tokens []uint32, lora, salt string) []byte {
	var p pickler
	p.begin(dst)
	p.boundary() // the outer tuple's own save
	p.saveBytes(parent)
	p.saveTokens(tokens)
	p.saveExtra(lora, salt)
	p.buf = append(p.buf, pkTuple3)
	p.memoize()
	return p.finish()
}

// appendPickleStr appends pickle.dumps(s, protocol=5).
func appendPickleStr(dst []byte, s string) []byte {
	var p pickler
	p.begin(dst)
	p.saveStr(s)
	return p.finish()
}
