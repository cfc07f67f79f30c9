//go:build unix

package datapath

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// clientWatch notices a client that goes away (EOF, reset) while the leg
// waits on a silent backend, without reading the client's bytes: it peeks.
// Without it a stalled stream whose client left held its in-flight slot
// until the silence bound (docs/body-leg.md, "Clients that leave").
type clientWatch struct {
	client net.Conn
	gone   atomic.Bool
	done   chan struct{}
}

// watchClient starts watching client; onGone runs once if it goes away.
// A client that sends its next request early is alive: the watch ends and
// leaves those bytes queued for the next request.
func watchClient(client net.Conn, onGone func()) *clientWatch {
	w := &clientWatch{client: client, done: make(chan struct{})}
	sc, ok := rawSocket(client).(syscall.Conn)
	if !ok {
		close(w.done)
		return w
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		close(w.done)
		return w
	}
	go func() {
		defer close(w.done)
		var peek [1]byte
		_ = rc.Read(func(fd uintptr) bool {
			n, _, rerr := unix.Recvfrom(int(fd), peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			switch {
			case rerr == unix.EAGAIN || rerr == unix.EINTR:
				return false
			case rerr != nil || n == 0:
				w.gone.Store(true)
				onGone()
			}
			return true
		})
	}()
	return w
}

// left reports whether the client has gone away so far.
func (w *clientWatch) left() bool { return w.gone.Load() }

// stop ends the watch (expiring the client's read deadline to wake it),
// waits for it, clears the deadline for the next request, and reports
// whether the client went away.
func (w *clientWatch) stop() bool {
	select {
	case <-w.done:
	default:
		_ = w.client.SetReadDeadline(time.Unix(1, 0))
		<-w.done
	}
	_ = w.client.SetReadDeadline(time.Time{})
	return w.gone.Load()
}

// rawSocket is the socket under a TLS client (*tls.Conn), whose peek sees
// the TLS records: a FIN or reset still reads as gone, while any record
// (the next request, a close_notify alert) reads as alive and ends the
// watch, leaving the silence bound to end a stream whose client left that
// way (docs/body-leg.md, "Clients that leave").
func rawSocket(c net.Conn) net.Conn {
	if u, ok := c.(interface{ NetConn() net.Conn }); ok {
		return u.NetConn()
	}
	return c
}
