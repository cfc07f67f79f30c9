//go:build !unix

package datapath

import "net"

// clientWatch is a no-op where sockets cannot be peeked at: a client that
// leaves is then noticed at the next write or at the silence bound.
type clientWatch struct{}

func watchClient(net.Conn, func()) *clientWatch { return &clientWatch{} }

func (*clientWatch) stop() bool { return false }

func (*clientWatch) left() bool { return false }
