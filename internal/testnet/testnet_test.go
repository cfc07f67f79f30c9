package testnet

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestAllocations(t *testing.T) {
	host := Host(t)
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Fatalf("Host %q is not a loopback address", host)
	}
	if b := Block(t); !strings.HasPrefix(b, "127.") || !strings.HasSuffix(b, ".") || net.ParseIP(b+"1") == nil {
		t.Fatalf("Block %q is not a 127.a.b. prefix", b)
	}
	for _, tc := range []struct {
		name   string
		offset int
	}{{"port", 0}, {"pair-1000", 1000}, {"pair-1", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			var p int
			if tc.offset == 0 {
				p = Port(t, host)
			} else {
				p = PortPair(t, host, tc.offset)
			}
			for _, q := range []int{p, p + tc.offset} {
				ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(q)))
				if err != nil {
					t.Fatalf("port %d not free on %s: %v", q, host, err)
				}
				ln.Close()
			}
		})
	}
}

// TestPortsDistinct: Ports never repeats a port. Successive Port calls do
// (bind to port 0 reuses a just-closed port; 47 of 500 rounds of 40 Port
// calls on 127.0.0.1 repeated one), which made tests that key state by port
// compare one rule with two histories.
func TestPortsDistinct(t *testing.T) {
	host := Host(t)
	for round := range 100 {
		ports := Ports(t, host, 40)
		seen := map[int]bool{}
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("round %d: port %d returned twice: %v", round, p, ports)
			}
			seen[p] = true
		}
	}
}
