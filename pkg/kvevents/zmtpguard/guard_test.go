package zmtpguard

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"testing/iotest"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/kvgate/kvgate/pkg/kvevents/zmtpguard/zmtptest"
)

// byteConn is a net.Conn whose peer sends exactly r's bytes; writes vanish.
type byteConn struct{ r io.Reader }

func (c byteConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (byteConn) Write(p []byte) (int, error)      { return len(p), nil }
func (byteConn) Close() error                     { return nil }
func (byteConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (byteConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (byteConn) SetDeadline(time.Time) error      { return nil }
func (byteConn) SetReadDeadline(time.Time) error  { return nil }
func (byteConn) SetWriteDeadline(time.Time) error { return nil }
func pub(rest ...[]byte) []byte {
	return bytes.Join(append([][]byte{zmtptest.Greeting(), zmtptest.Ready("PUB")}, rest...), nil)
}
func open(t *testing.T, stream []byte, bound uint64) (*zmq4.Conn, error) {
	t.Helper()
	// One byte per read: every state boundary of the guard is crossed mid-read.
	return zmq4.Open(NewConn(byteConn{iotest.OneByteReader(bytes.NewReader(stream))}, bound), null.Security(), zmq4.Sub, nil, false, nil)
}

func TestGuardLimits(t *testing.T) {
	const bound = 8192
	big := make([]byte, bound)
	cases := []struct {
		name    string
		stream  []byte
		frames  int   // frames of the one message expected, 0 = none
		wantErr error // from the handshake or the first RecvMsg
	}{
		{"short message", pub(zmtptest.Message([]byte("kv"), make([]byte, 8), []byte("p"))), 3, nil},
		{"frame exactly at the bound", pub(zmtptest.Message(big)), 1, nil},
		{"message exactly at the bound", pub(zmtptest.Message(big[:4096], big[:4096])), 2, nil},
		{"64 frames", pub(zmtptest.Message(make([][]byte, 64)...)), 64, nil},
		{"long flag with a short size", pub([]byte{0x02, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'}), 1, nil},
		{"frame over the bound", pub(zmtptest.LongHeader(0, bound+1)), 0, &LimitError{}},
		{"2^50 frame", pub(zmtptest.LongHeader(0, 1<<50)), 0, &LimitError{}},
		{"2^64-1 frame", pub(zmtptest.LongHeader(0, 1<<64-1)), 0, &LimitError{}},
		{"message over the bound", pub(zmtptest.Message(big[:4096], big[:4097])), 0, &LimitError{}},
		{"65 frames", pub(zmtptest.Message(make([][]byte, 65)...)), 0, &LimitError{}},
		{"command inside a message", pub(zmtptest.Frame(0x01, []byte("a")), zmtptest.Command([]byte("\x04PING"))), 0, ErrBadCommand},
		{"READY truncated property", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x05abcde"))...), 0, ErrBadCommand},
		{"READY value past the end", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x01a\x00\x00\x00\x09xy"))...), 0, ErrBadCommand},
		{"READY empty name", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x00\x00\x00\x00\x00"))...), 0, ErrBadCommand},
		{"READY without Socket-Type", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x08Identity\x00\x00\x00\x00"))...), 0, ErrBadCommand},
		{"READY with an unknown Socket-Type", append(zmtptest.Greeting(), zmtptest.Ready("BOGUS")...), 0, ErrBadCommand},
		{"READY with SOCKET-TYPE", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x0bSOCKET-TYPE\x00\x00\x00\x03PUB"))...), 0, ErrBadCommand},
		{"READY with a non-ASCII name", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x0c\xc5\xbfocket-type\x00\x00\x00\x03PUB"))...), 0, ErrBadCommand},
		{"command name past the end", append(zmtptest.Greeting(), zmtptest.Command([]byte("\x09READY"))...), 0, ErrBadCommand},
		{"empty command", append(zmtptest.Greeting(), zmtptest.Command(nil)...), 0, ErrBadCommand},
		{"command over 64 KiB", append(zmtptest.Greeting(), zmtptest.LongHeader(0x04, 64<<10+1)...), 0, &LimitError{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			zc, err := open(t, tc.stream, bound)
			var msg zmq4.Msg
			if err == nil {
				msg, err = zc.RecvMsg()
			}
			var wantLimit *LimitError
			switch {
			case tc.wantErr == nil:
				if err != nil {
					t.Fatalf("err = %v, want a message", err)
				}
				if len(msg.Frames) != tc.frames {
					t.Fatalf("frames = %d, want %d", len(msg.Frames), tc.frames)
				}
			case errors.As(tc.wantErr, &wantLimit):
				var le *LimitError
				if !errors.As(err, &le) {
					t.Fatalf("err = %v, want a LimitError", err)
				}
			default:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			}
		})
	}
}

// TestGuardSticky: after a limit, the stream stays failed even if the
// attacker's bytes would happen to look like a valid frame again.
func TestGuardSticky(t *testing.T) {
	stream := pub(zmtptest.LongHeader(0, 1<<40), zmtptest.Message([]byte("ok")))
	zc, err := open(t, stream, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := zc.RecvMsg(); err == nil {
			t.Fatal("a message was read after the limit")
		}
	}
}

func TestEndpointAddr(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{"tcp://127.0.0.1:5557", "kvgate-tcp://127.0.0.1:5557;max=65536"},
		{"tcp://[::1]:6557", "kvgate-tcp://[::1]:6557;max=65536"},
		{"ipc:///tmp/x", "ipc:///tmp/x"},
		{"tcp://nonsense", "tcp://nonsense"},
	}
	for _, tc := range cases {
		if got := Wrap(tc.in, 65536); got != tc.want {
			t.Errorf("Wrap(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	bad := []string{"127.0.0.1:1", "127.0.0.1:1;max=10", "127.0.0.1:1;max=x", "nohost;max=65536"}
	for _, a := range bad {
		if _, err := (tcpTransport{}).Addr(a); err == nil {
			t.Errorf("Addr(%q) accepted", a)
		}
	}
}

// FuzzZMTPPeer feeds arbitrary peer bytes to zmq4's own greeting, NULL
// handshake and framing through the guard, as a SUB and as a DEALER: nothing
// may panic, and no message may exceed the bound.
//
//	go test -run '^$' -fuzz FuzzZMTPPeer -fuzztime 3m ./pkg/kvevents/zmtpguard/
func FuzzZMTPPeer(f *testing.F) {
	f.Add(false, pub(zmtptest.Message([]byte("kv-events"), make([]byte, 8), []byte{0x93, 1, 2, 3})))
	f.Add(true, append(zmtptest.Greeting(), append(zmtptest.Ready("ROUTER"), zmtptest.Message(nil, []byte("kv-events"), make([]byte, 8), []byte{0x90})...)...))
	f.Add(false, pub(zmtptest.LongHeader(0, 1<<50)))
	f.Add(false, append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x05abcde"))...))
	f.Add(true, pub(zmtptest.Command([]byte("\x04PING\x00\x10")), zmtptest.Message(make([][]byte, 10)...)))
	const bound = 4096
	f.Fuzz(func(t *testing.T, dealer bool, stream []byte) {
		typ := zmq4.Sub
		if dealer {
			typ = zmq4.Dealer
		}
		zc, err := zmq4.Open(NewConn(byteConn{bytes.NewReader(stream)}, bound), null.Security(), typ, nil, false, nil)
		if err != nil {
			return
		}
		for range 16 {
			msg, err := zc.RecvMsg()
			if err != nil {
				return
			}
			n := 0
			for _, fr := range msg.Frames {
				n += len(fr)
			}
			if n > bound || len(msg.Frames) > MaxFramesPerMessage {
				t.Fatalf("message of %d bytes in %d frames passed a %d-byte bound", n, len(msg.Frames), bound)
			}
		}
	})
}

// BenchmarkRecvMsg measures what the guard adds to zmq4's receive path: b.N
// KV-event messages ([topic, seq, 4 KiB payload]) read through zmq4.Conn
// from memory, plain and guarded.
//
//	go test -run '^$' -bench RecvMsg -count 6 ./pkg/kvevents/zmtpguard/
func BenchmarkRecvMsg(b *testing.B) {
	msg := zmtptest.Message([]byte("kv-events"), make([]byte, 8), make([]byte, 4096))
	for _, guarded := range []bool{false, true} {
		name := "plain"
		if guarded {
			name = "guarded"
		}
		b.Run(name, func(b *testing.B) {
			stream := pub(bytes.Repeat(msg, b.N))
			var c net.Conn = byteConn{bytes.NewReader(stream)}
			if guarded {
				c = NewConn(c, DefaultMaxFrameBytes)
			}
			zc, err := zmq4.Open(c, null.Security(), zmq4.Sub, nil, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(msg)))
			b.ResetTimer()
			for range b.N {
				if _, err := zc.RecvMsg(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
