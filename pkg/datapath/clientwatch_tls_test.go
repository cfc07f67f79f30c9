package datapath

import (
	"context"
	"crypto/tls"
	"io"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// tlsPair returns the server side (kvgate's, a *tls.Conn) and the client
// side of a loopback TLS connection, handshake done.
func tlsPair(t *testing.T) (server, client *tls.Conn) {
	t.Helper()
	ca, err := testcerts.NewCA("watch CA")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Server("kvgate", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	far, near := tcpPair(t)
	server = tls.Server(near, &tls.Config{Certificates: []tls.Certificate{cert}})
	client = tls.Client(far, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	done := make(chan error, 1)
	go func() { done <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return server, client
}

// TestUserspaceLegTLSClient: the client watch works through a *tls.Conn. A
// client that closes its socket is noticed at once (ClientGone); one that
// sends a TLS record first (a close_notify alert) degrades safely: the leg
// still ends, here at the silence bound, and never reads the record.
func TestUserspaceLegTLSClient(t *testing.T) {
	cases := []struct {
		name    string
		leave   func(c *tls.Conn)
		silence time.Duration
		want    Ending
	}{
		{"socket closed", func(c *tls.Conn) { _ = c.NetConn().Close() }, 30 * time.Second, ClientGone},
		{"close_notify then close", func(c *tls.Conn) { _ = c.CloseWrite(); time.Sleep(50 * time.Millisecond); _ = c.NetConn().Close() }, time.Second, Silence},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			server, client := tlsPair(t)
			backend, backendFar := tcpPair(t)
			go func() { _, _ = io.WriteString(backendFar, "6\r\ndata: \r\n") }()
			done := make(chan Result, 1)
			go func() {
				done <- NewUserspace(32<<10).Run(context.Background(), server, backend, nil,
					Options{End: &endAfter{n: 1 << 20}, ContentLength: -1, Silence: tc.silence})
			}()
			buf := make([]byte, 64)
			if _, err := client.Read(buf); err != nil {
				t.Fatal(err)
			}
			tc.leave(client)
			select {
			case r := <-done:
				if r.Ending != tc.want {
					t.Fatalf("ending %v (%v), want %v", r.Ending, r.Err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the leg did not end")
			}
		})
	}
}
