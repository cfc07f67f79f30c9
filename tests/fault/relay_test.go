//go:build linux

package fault

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// relayDelayed listens on addr in the engines' namespace and relays each
// connection to upstream, delivering every read delay after it arrived in
// each direction (in order): a delaying link without netem.
func relayDelayed(t *testing.T, tp *topo, addr, upstream string, delay time.Duration) {
	t.Helper()
	var ln net.Listener
	if err := inNS(tp.eng, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var up net.Conn
			if err := inNS(tp.eng, func() error {
				var err error
				up, err = net.DialTimeout("tcp", upstream, 5*time.Second)
				return err
			}); err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); delayedCopy(up, c, delay) }()
			go func() { defer wg.Done(); delayedCopy(c, up, delay) }()
		}
	}()
}

type delayed struct {
	due  time.Time
	data []byte // nil: the source closed
}

// delayedCopy copies src to dst, each read delivered delay after it arrived;
// the source's EOF becomes a half-close of dst, its error a close of both.
func delayedCopy(dst, src net.Conn, delay time.Duration) {
	q := make(chan delayed, 4096)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- delayed{time.Now().Add(delay), b[:n]}
			}
			if err != nil {
				q <- delayed{due: time.Now().Add(delay)}
				return
			}
		}
	}()
	for d := range q {
		time.Sleep(time.Until(d.due))
		if d.data == nil {
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			continue
		}
		if _, err := dst.Write(d.data); err != nil {
			dst.Close()
			src.Close()
			for range q {
			}
			return
		}
	}
}

// brokenServer listens on addr in the engines' namespace and answers every
// request with an SSE stream that it cuts after two events, without the
// last chunk: a backend that breaks every response.
func brokenServer(t *testing.T, tp *topo, addr string) {
	t.Helper()
	var ln net.Listener
	if err := inNS(tp.eng, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				ev := func(i int) string {
					d := fmt.Sprintf("data: {\"id\":\"broken\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d\"}}]}\n\n", i)
					return fmt.Sprintf("%x\r\n%s\r\n", len(d), d)
				}
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nx-engine-id: broken\r\n\r\n%s", ev(0))
				time.Sleep(30 * time.Millisecond) // past the splice's insertion
				fmt.Fprint(c, ev(1))
				time.Sleep(30 * time.Millisecond)
			}()
		}
	}()
}
