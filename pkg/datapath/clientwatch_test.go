package datapath

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestUserspaceLegNoticesClientLeaving: the backend sends one chunk of an
// event stream and goes silent; the client closes. The leg must end at once
// (ClientGone), not hold the request until the silence bound. It waited the
// whole bound before the client watch (seen as a splice leg stuck for 60 s
// once the kernel leg fell back to the userspace copy under load).
func TestUserspaceLegNoticesClientLeaving(t *testing.T) {
	tests := []struct {
		name  string
		leave func(c net.Conn)
	}{
		{"close", func(c net.Conn) { c.Close() }},
		{"reset", func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0); c.Close() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clientFar, client := tcpPair(t) // kvgate holds client; the test is the far end
			backend, backendFar := tcpPair(t)
			go func() { _, _ = io.WriteString(backendFar, "6\r\ndata: \r\n") }()
			done := make(chan Result, 1)
			go func() {
				done <- NewUserspace(32<<10).Run(context.Background(), client, backend, nil,
					Options{End: &endAfter{n: 1 << 20}, ContentLength: -1, Silence: 30 * time.Second})
			}()
			buf := make([]byte, 64)
			if _, err := clientFar.Read(buf); err != nil {
				t.Fatal(err)
			}
			tc.leave(clientFar)
			select {
			case r := <-done:
				if r.Ending != ClientGone {
					t.Fatalf("ending %v (%v), want ClientGone", r.Ending, r.Err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the leg did not notice the client leaving")
			}
		})
	}
}

// TestClientWatchLeavesPipelinedBytes: a client that sends its next request
// while its response is still streaming is alive; the watch ends without
// reading those bytes, and the leg runs to the body's end.
func TestClientWatchLeavesPipelinedBytes(t *testing.T) {
	clientFar, client := tcpPair(t)
	backend, backendFar := tcpPair(t)
	done := make(chan Result, 1)
	const body = "2\r\nhi\r\n0\r\n\r\n"
	go func() {
		done <- NewUserspace(32<<10).Run(context.Background(), client, backend, nil,
			Options{End: &endAfter{n: len(body)}, ContentLength: -1, Silence: 30 * time.Second})
	}()
	const next = "GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := io.WriteString(clientFar, next); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := io.WriteString(backendFar, body); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Ending != BackendEOF {
			t.Fatalf("ending %v (%v), want BackendEOF", r.Ending, r.Err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the leg did not finish")
	}
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
	got := make([]byte, len(next))
	if _, err := io.ReadFull(client, got); err != nil || string(got) != next {
		t.Fatalf("the next request was not left queued: %q %v", got, err)
	}
}
