// Package zmtpguard bounds what a ZeroMQ peer can make kvgate allocate.
//
// go-zeromq/zmq4 reads each ZMTP frame by allocating the size the peer
// declares in the frame header, in a reader goroutine of its own, and it
// parses the peer's READY metadata without checking lengths. One hostile
// 9-byte header (a long frame of 2^50 bytes), or a short malformed READY,
// therefore panics the whole process, and no recover in kvgate can reach the
// library's goroutine. This package sits under zmq4 instead: Conn wraps the
// TCP connection and parses the same ZMTP 3 stream zmq4 reads, refusing a
// frame or message over the bound, and a malformed command, before zmq4
// sees the header that would make it allocate. See docs/ingest.md, "Bounded
// frames".
//
// The bound travels in the dial address (Endpoint), not in package state:
// zmq4's transport registry is process-wide, so one stateless transport,
// registered once under Scheme, serves every socket with its own bound.
package zmtpguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
)

// DefaultMaxFrameBytes is LLB_KV_MAX_FRAME_BYTES's default (64 MiB): far
// above any KV-event batch vLLM publishes, far below what hurts the host.
const DefaultMaxFrameBytes = 64 << 20

// MinMaxFrameBytes is the smallest bound accepted: a READY command with the
// longest socket identity ZMTP allows must still fit.
const MinMaxFrameBytes = 4096

// MaxFramesPerMessage bounds the frames of one multipart message. vLLM sends
// at most 5 (replay reply with identity); zmq4 keeps a slice header per frame,
// so a stream of empty "more" frames would otherwise grow without bound.
const MaxFramesPerMessage = 64

// maxCommandBytes bounds a ZMTP command body, which the guard buffers whole to
// validate it. NULL-security READY metadata is a few hundred bytes.
const maxCommandBytes = 64 << 10

// greetingLen is the fixed ZMTP 3 greeting zmq4 reads in one piece.
const greetingLen = 64

// ZMTP frame flag bits (ZMTP 3.1 framing).
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// LimitError reports a frame, message or command the peer declared beyond a bound.
type LimitError struct {
	What  string // "frame", "message", "frames per message" or "command"
	Size  uint64 // what the peer declared (bytes, or frames)
	Limit uint64
}

func (e *LimitError) Error() string {
	switch e.What {
	case "frames per message":
		return fmt.Sprintf("zmtpguard: message has more than %d frames", e.Limit)
	case "command":
		return fmt.Sprintf("zmtpguard: peer declared a command of %d bytes, over the %d-byte command bound", e.Size, e.Limit)
	}
	return fmt.Sprintf("zmtpguard: peer declared a %s of %d bytes, over the %d-byte bound (LLB_KV_MAX_FRAME_BYTES)", e.What, e.Size, e.Limit)
}

// ErrBadCommand reports a ZMTP command zmq4 would mis-parse.
var ErrBadCommand = errors.New("zmtpguard: malformed ZMTP command")

// Conn is a net.Conn whose reads are checked against ZMTP framing limits.
// Writes pass through. Once a limit is hit every later read fails with the
// same error, so the stream can never resynchronise on attacker data.
type Conn struct {
	net.Conn
	maxFrame uint64

	greetLeft int    // greeting bytes still to pass through
	bodyLeft  uint64 // data-frame body bytes still to pass through
	pend      []byte // a validated header (and command body) not yet handed out
	hdr       [9]byte
	msgBytes  uint64 // bytes in the current multipart message so far
	msgFrames int
	err       error
}

// NewConn wraps c; maxFrame bounds each frame and each whole message.
func NewConn(c net.Conn, maxFrame uint64) *Conn {
	return &Conn{Conn: c, maxFrame: maxFrame, greetLeft: greetingLen}
}

// Read implements io.Reader over the checked stream.
func (c *Conn) Read(p []byte) (int, error) {
	for {
		if len(p) == 0 {
			return 0, nil
		}
		if len(c.pend) > 0 {
			n := copy(p, c.pend)
			c.pend = c.pend[n:]
			return n, nil
		}
		if c.err != nil {
			return 0, c.err
		}
		if c.greetLeft > 0 {
			n, err := c.Conn.Read(p[:min(len(p), c.greetLeft)])
			c.greetLeft -= n
			return n, err
		}
		if c.bodyLeft > 0 {
			n, err := c.Conn.Read(p[:min(uint64(len(p)), c.bodyLeft)])
			c.bodyLeft -= uint64(n)
			return n, err
		}
		if err := c.nextFrame(); err != nil {
			c.err = err
			return 0, err
		}
	}
}

// nextFrame reads and checks one frame header (and a command's whole body)
// into pend.
func (c *Conn) nextFrame() error {
	if _, err := io.ReadFull(c.Conn, c.hdr[:2]); err != nil {
		return err
	}
	fl := c.hdr[0]
	hl := 2
	size := uint64(c.hdr[1])
	if fl&flagLong != 0 {
		if _, err := io.ReadFull(c.Conn, c.hdr[2:9]); err != nil {
			return err
		}
		hl = 9
		size = binary.BigEndian.Uint64(c.hdr[1:9])
	}
	if fl&flagCommand != 0 {
		// A command is one frame and never part of a message.
		if c.msgFrames > 0 || fl&flagMore != 0 {
			return fmt.Errorf("%w: command frame inside a multipart message", ErrBadCommand)
		}
		if size > maxCommandBytes || size > c.maxFrame {
			return &LimitError{What: "command", Size: size, Limit: min(maxCommandBytes, c.maxFrame)}
		}
		buf := make([]byte, hl+int(size))
		copy(buf, c.hdr[:hl])
		if _, err := io.ReadFull(c.Conn, buf[hl:]); err != nil {
			return err
		}
		if err := CheckCommand(buf[hl:]); err != nil {
			return err
		}
		c.pend = buf
		return nil
	}
	if size > c.maxFrame {
		return &LimitError{What: "frame", Size: size, Limit: c.maxFrame}
	}
	if c.msgBytes+size > c.maxFrame {
		return &LimitError{What: "message", Size: c.msgBytes + size, Limit: c.maxFrame}
	}
	if c.msgFrames+1 > MaxFramesPerMessage {
		return &LimitError{What: "frames per message", Size: uint64(c.msgFrames + 1), Limit: MaxFramesPerMessage}
	}
	if fl&flagMore != 0 {
		c.msgBytes += size
		c.msgFrames++
	} else {
		c.msgBytes, c.msgFrames = 0, 0
	}
	c.bodyLeft = size
	c.pend = c.hdr[:hl]
	return nil
}

// CheckCommand validates a ZMTP command body (name length, name, data). For
// READY it checks the metadata property list byte for byte, since zmq4's
// parser indexes past the end of a truncated property and panics.
func CheckCommand(body []byte) error {
	if len(body) == 0 {
		return fmt.Errorf("%w: empty command", ErrBadCommand)
	}
	n := int(body[0])
	if n == 0 || n > len(body)-1 {
		return fmt.Errorf("%w: name length %d in a %d-byte command", ErrBadCommand, n, len(body))
	}
	if string(body[1:1+n]) != "READY" {
		return nil
	}
	return checkMetadata(body[1+n:])
}

// knownSocketTypes are the peer types zmq4 understands; for any other value
// zmq4's compatibility check panics.
var knownSocketTypes = map[string]bool{
	"PAIR": true, "PUB": true, "SUB": true, "REQ": true, "REP": true, "DEALER": true,
	"ROUTER": true, "PULL": true, "PUSH": true, "XPUB": true, "XSUB": true,
}

// checkMetadata walks ZMTP properties (name-size(1) name value-size(4)
// value) and requires what zmq4 assumes without checking: names within the
// ZMTP grammar, and a Socket-Type it knows. zmq4 title-cases each name into a
// map, so only the spellings that title to "Socket-Type" set it, and the last
// one wins.
func checkMetadata(p []byte) error {
	sockType, seen := "", false
	for i := 0; i < len(p); {
		k := int(p[i])
		i++
		if k == 0 || k > len(p)-i {
			return fmt.Errorf("%w: READY property name of %d bytes with %d left", ErrBadCommand, k, len(p)-i)
		}
		name := string(p[i : i+k])
		i += k
		if len(p)-i < 4 {
			return fmt.Errorf("%w: READY property value size truncated", ErrBadCommand)
		}
		v := uint64(binary.BigEndian.Uint32(p[i:]))
		i += 4
		if v > uint64(len(p)-i) {
			return fmt.Errorf("%w: READY property value of %d bytes with %d left", ErrBadCommand, v, len(p)-i)
		}
		value := string(p[i : i+int(v)])
		i += int(v)
		for j := 0; j < len(name); j++ {
			if c := name[j]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '+') {
				return fmt.Errorf("%w: READY property name %q outside the ZMTP grammar", ErrBadCommand, name)
			}
		}
		if strings.EqualFold(name, "socket-type") {
			switch name {
			case "Socket-Type", "socket-type", "Socket-type", "socket-Type":
			default:
				return fmt.Errorf("%w: READY property %q is a Socket-Type zmq4 would not read", ErrBadCommand, name)
			}
			sockType, seen = value, true
		}
	}
	if !seen || !knownSocketTypes[sockType] {
		return fmt.Errorf("%w: READY without a known Socket-Type (got %q)", ErrBadCommand, sockType)
	}
	return nil
}
