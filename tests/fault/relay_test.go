//go:build linux

package fault

import (
	"net"
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
