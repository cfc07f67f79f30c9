//go:build !linux

package fullproxy

import "net"

// peekSocket cannot peek off Linux: stillOpen falls back to a short read.
func peekSocket(net.Conn) peekResult { return peekUnknown }
