package fullproxy

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// freebind sets IP_FREEBIND (IPV6_FREEBIND for v6 sockets) so a VIP can be
// bound before it is configured on an interface.
func freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "tcp6" {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set IP_FREEBIND: %w", serr)
	}
	return nil
}
