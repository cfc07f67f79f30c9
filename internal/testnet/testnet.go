// Package testnet allocates loopback addresses and ports for tests. Test
// packages run in parallel and several bind fixed port pairs (ZeroMQ PUB and
// replay ports), so each test draws its own address inside 127.0.0.0/8.
package testnet

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// Host returns a random loopback address 127.<100-199>.<0-249>.<2-251> that
// accepts a listener.
func Host(t testing.TB) string {
	t.Helper()
	for range 50 {
		h := fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), rand.IntN(250), 2+rand.IntN(250))
		if ln, err := net.Listen("tcp", h+":0"); err == nil {
			ln.Close()
			return h
		}
	}
	t.Fatal("no free loopback address")
	return ""
}

// Block returns the prefix "127.<a>.<b>." of a random /24 for one test, which
// names its hosts by the last octet (Block(t)+"11").
func Block(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.%d.%d.", 100+rand.IntN(150), rand.IntN(250))
}

// Port returns a TCP port that was free on host a moment ago (nothing
// listens on it when Port returns).
func Port(t testing.TB, host string) int {
	t.Helper()
	p, err := FreePort(host)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// PortPair returns a port p free on host such that p+offset is free as well
// (a ZeroMQ PUB port and its replay port).
func PortPair(t testing.TB, host string, offset int) int {
	t.Helper()
	p, err := FreePortPair(host, offset)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Ports returns n distinct TCP ports that were free on host a moment ago.
// Successive Port calls may return the same port (each listener closes
// before the next one binds); Ports holds every listener until all n are
// bound.
func Ports(t testing.TB, host string, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("listen %s: %v", host, err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// FreePort is Port for callers without a testing.TB (the bench commands).
func FreePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("listen %s: %w", host, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// FreePortPair is PortPair for callers without a testing.TB.
func FreePortPair(host string, offset int) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("listen %s: %w", host, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port+offset)))
		l.Close()
		if err == nil {
			l2.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port pair on %s (offset %d)", host, offset)
}
