package fullproxy

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// peekSocket looks at an idle socket without blocking or consuming a byte
// (recv with MSG_PEEK|MSG_DONTWAIT).
func peekSocket(c net.Conn) peekResult {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peekUnknown
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return peekClosed
	}
	res := peekUnknown
	var buf [1]byte
	cerr := rc.Control(func(fd uintptr) {
		n, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			res = peekIdle
		case err != nil || n == 0:
			res = peekClosed
		default:
			res = peekPending
		}
	})
	if cerr != nil {
		return peekClosed
	}
	return res
}
