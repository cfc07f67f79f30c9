// Package zmtptest builds raw ZMTP 3 bytes for tests that play a hostile or
// hand-rolled ZeroMQ peer over a plain TCP socket (pkg/kvevents/ingest and
// tests/kvfault use it to send what no real libzmq would).
package zmtptest

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// Greeting is a ZMTP 3.0 NULL-mechanism greeting (64 bytes).
func Greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], "NULL")
	return g
}

// Command returns one command frame with the given body.
func Command(body []byte) []byte {
	return Frame(0x04, body)
}

// Ready returns a READY command announcing sockType (e.g. "PUB", "ROUTER").
func Ready(sockType string) []byte {
	body := []byte{5}
	body = append(body, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(sockType)))
	body = append(body, sockType...)
	return Command(body)
}

// Frame encodes one frame with flags (0x01 more, 0x04 command); the long
// flag is added when the body needs it.
func Frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		h := LongHeader(flags, uint64(len(body)))
		return append(h, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// LongHeader is the 9-byte header of a long frame declaring size bytes.
func LongHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

// Message encodes frames as one multipart message.
func Message(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		var fl byte
		if i < len(frames)-1 {
			fl = 0x01
		}
		out = append(out, Frame(fl, f)...)
	}
	return out
}

// Handshake sends the greeting and a READY for sockType on c, then reads the
// peer's greeting and READY, with a bound on the whole exchange.
func Handshake(c net.Conn, sockType string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(append(Greeting(), Ready(sockType)...)); err != nil {
		return fmt.Errorf("zmtptest: send greeting: %w", err)
	}
	var g [64]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		return fmt.Errorf("zmtptest: read greeting: %w", err)
	}
	_, err := ReadFrame(c)
	return err
}

// ReadFrame reads one frame (up to 1 MiB) and returns its flags and body.
func ReadFrame(c io.Reader) ([]byte, error) {
	var h [9]byte
	if _, err := io.ReadFull(c, h[:2]); err != nil {
		return nil, fmt.Errorf("zmtptest: read frame header: %w", err)
	}
	size := uint64(h[1])
	if h[0]&0x02 != 0 {
		if _, err := io.ReadFull(c, h[2:9]); err != nil {
			return nil, fmt.Errorf("zmtptest: read long header: %w", err)
		}
		size = binary.BigEndian.Uint64(h[1:9])
	}
	if size > 1<<20 {
		return nil, fmt.Errorf("zmtptest: frame of %d bytes", size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, fmt.Errorf("zmtptest: read frame body: %w", err)
	}
	return append([]byte{h[0]}, body...), nil
}

// ReadMessage reads frames until one without the more flag; each returned
// frame is the body without its flag byte.
func ReadMessage(c io.Reader) ([][]byte, error) {
	var out [][]byte
	for range 64 {
		f, err := ReadFrame(c)
		if err != nil {
			return out, err
		}
		out = append(out, f[1:])
		if f[0]&0x01 == 0 {
			return out, nil
		}
	}
	return out, fmt.Errorf("zmtptest: message has more than 64 frames")
}
