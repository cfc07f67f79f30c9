//go:build linux

package splice

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// legBound is how long a test waits for a leg that should end; a leg still
// running after it is hung (the defect these tests guard), not slow.
const legBound = 20 * time.Second

// TestClientGoneDuringFinalDrain forces the interleaving behind the legs
// that never returned under concurrency: the backend has finished (EOF) and
// the leg waits for the client socket to take the redirected bytes when
// the client goes away. The client watcher reports once; the final drain
// consumed that report, and the teardown then waited for a second one that
// never came, so Run never returned (its in-flight load and the shutdown
// waited forever). The client here stops reading so the final drain cannot
// finish, and resets once the leg is in it (backend out of the map, client
// still in). A cancelled context (the shutdown grace is over) ends the same
// wait.
func TestClientGoneDuringFinalDrain(t *testing.T) {
	d := openTest(t, Config{})
	be := startBackend(t, "127.0.0.1:0")
	be.gate = make(chan struct{})
	for _, tc := range []struct {
		how  string
		want datapath.Ending
	}{{"reset", datapath.ClientGone}, {"close", datapath.ClientGone}, {"cancel", datapath.Cancelled}} {
		how := tc.how
		t.Run(how, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			// A tiny receive window on the test client and a tiny send
			// buffer on kvgate's side keep the redirected tail queued.
			dl := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
			}}
			cc, err := dl.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			server := <-accepted
			defer server.Close()
			_ = server.(*net.TCPConn).SetWriteBuffer(4096)

			bc, err := net.Dial("tcp", be.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer bc.Close()
			fmt.Fprintf(bc, "GET /gated?chunks=800&split=1 HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(bc)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp
			prefix, _ := br.Peek(br.Buffered())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan datapath.Result, 1)
			go func() {
				done <- d.Run(ctx, server, bc, prefix, datapath.Options{Streamed: true, TokenStream: true, ContentLength: -1})
			}()
			waitEntries(t, d, 1, 1)
			be.gate <- struct{}{} // the rest of the body and the backend's FIN
			waitEntries(t, d, 0, 1)
			switch how {
			case "reset":
				_ = cc.(*net.TCPConn).SetLinger(0)
				cc.Close()
			case "close":
				cc.Close()
			case "cancel": // the shutdown grace ends while a slow client drains
				cancel()
			}
			select {
			case r := <-done:
				if r.Ending != tc.want {
					t.Fatalf("ending %v (%v), want %v", r.Ending, r.Err, tc.want)
				}
			case <-time.After(legBound):
				t.Fatal("the leg did not return after the client went away during the final drain")
			}
			assertNoEntries(t, d)
		})
	}
}

// waitEntries waits until the maps hold b backends and c clients.
func waitEntries(t *testing.T, d *Datapath, b, c int) {
	t.Helper()
	deadline := time.Now().Add(legBound)
	for {
		nb, nc, _, err := d.Entries()
		if err != nil {
			t.Fatal(err)
		}
		if nb == b && nc == c {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("maps hold %d backends and %d clients, want %d and %d", nb, nc, b, c)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentFreshConnections is the reported pattern: concurrent
// clients, one fresh connection per streamed request, closed as soon as the
// body is read. Every leg must return and leave nothing behind.
func TestConcurrentFreshConnections(t *testing.T) {
	d := openTest(t, Config{StreamedOnly: true})
	be := startBackend(t, "127.0.0.1:0")
	p := startProxy(t, d, func(string) string { return be.addr() })
	const clients, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				target := fmt.Sprintf("/sse?chunks=9&seed=%d&gap=300", c*each+i)
				conn, err := net.Dial("tcp", p.ln.Addr().String())
				if err != nil {
					errs <- err
					return
				}
				cl := &client{c: conn, br: bufio.NewReader(conn)}
				_, n, err := cl.get(target)
				conn.Close()
				if err != nil || n != int64(len(expectedBody(target))) {
					errs <- fmt.Errorf("%s: %d bytes, %w", target, n, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := 0; i < clients*each; i++ {
		select {
		case <-p.results:
		case <-time.After(legBound):
			t.Fatalf("%d of %d legs never returned", clients*each-i, clients*each)
		}
	}
	assertNoEntries(t, d)
}
