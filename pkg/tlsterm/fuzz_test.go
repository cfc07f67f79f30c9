package tlsterm

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// FuzzHandshakeInput: whatever a client sends before hanging up, the
// handshake fails with one of the documented reasons, within its timeout,
// and never panics.
func FuzzHandshakeInput(f *testing.F) {
	for _, seed := range [][]byte{
		nil,
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		{0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x0f, 0xff, 0xff},
		{0x16, 0x03, 0x01, 0xff, 0xff},
		{0x16, 0x03, 0x03, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00},
		{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28},
	} {
		f.Add(seed)
	}
	ca, err := testcerts.NewCA("fuzz CA")
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	pair, err := ca.Server("fuzz", "127.0.0.1")
	if err != nil {
		f.Fatal(err)
	}
	if err := pair.Write(dir); err != nil {
		f.Fatal(err)
	}
	obs := newCountObserver()
	term, err := New(Options{Dir: dir, Observer: obs, HandshakeTimeout: 200 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	known := []string{"timeout", "plain_http", "oversize", "bad_record", "client_cert", "eof", "protocol"}
	f.Fuzz(func(t *testing.T, first []byte) {
		client, server := net.Pipe()
		defer client.Close()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		go func() {
			// Then hang up, so the fuzzer does not wait for the timeout on
			// every short input (TestBadHandshakes covers the timeout).
			_, _ = client.Write(first)
			_ = client.Close()
		}()
		start := time.Now()
		err := term.Handshake(context.Background(), term.Wrap(server))
		server.Close()
		if err == nil {
			t.Fatalf("a handshake from %q succeeded", first)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the handshake took %s", time.Since(start))
		}
		if r := Reason(err); !slices.Contains(known, r) {
			t.Fatalf("reason %q for %v", r, err)
		}
	})
}
