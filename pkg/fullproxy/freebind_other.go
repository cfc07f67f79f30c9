//go:build !linux

package fullproxy

import "syscall"

// freebind is a no-op off Linux: IP_FREEBIND is a Linux socket option, so a
// VIP must already be configured on an interface before its rule binds.
func freebind(string, string, syscall.RawConn) error { return nil }
