//go:build linux

package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/splice"
)

// openSplice opens the real kernel data path (root, BPF); it skips without
// BPF unless KVGATE_REQUIRE_BPF=1.
func openSplice(t *testing.T) *splice.Datapath {
	t.Helper()
	// test-<pid>-…: pkg/splice's tests sweep such pins after a crash.
	d, err := splice.Open(splice.Config{Instance: fmt.Sprintf("test-%d-gateway", os.Getpid()), Logger: quietLogger()})
	if err != nil {
		if os.Getenv("KVGATE_REQUIRE_BPF") == "1" || !errors.Is(err, datapath.ErrKernelUnavailable) {
			t.Fatalf("opening the sockmap data path: %v", err)
		}
		t.Skipf("no BPF here (set KVGATE_REQUIRE_BPF=1 to fail instead): %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestLoadSlots: endpoints of several rules get load-map slots per backend
// address; a tagged connection to an endpoint counts, an untagged one (a
// probe) does not; an address leaves the map with its last user.
func TestLoadSlots(t *testing.T) {
	d := openSplice(t)
	s := newLoadSlots(d, quietLogger())
	block := testnet.Block(t)
	var lns []net.Listener
	var eps []config.Endpoint
	for i := range 2 {
		ln, err := net.Listen("tcp", block+"1"+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		ap := netip.MustParseAddrPort(ln.Addr().String())
		lns = append(lns, ln)
		eps = append(eps, config.Endpoint{Idx: i, IP: ap.Addr().String(), TargetPort: int(ap.Port())})
	}
	conns := func(service, ep int) uint64 {
		t.Helper()
		n, err := s.activeConns(service, ep)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitConns := func(service, ep int, want uint64) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); conns(service, ep) != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("service %d ep %d: %d connections in the load map, want %d", service, ep, conns(service, ep), want)
			}
		}
	}

	// Rule 1 has both endpoints; rule 2's ep 5 is rule 1's ep 0 (same address).
	s.set(1, eps[0])
	s.set(1, eps[1])
	shared := eps[0]
	shared.Idx = 5
	s.set(2, shared)
	if s.slot[netip.MustParseAddrPort(lns[0].Addr().String())] == s.slot[netip.MustParseAddrPort(lns[1].Addr().String())] {
		t.Fatal("two addresses share a slot")
	}
	if len(s.slot) != 2 {
		t.Fatalf("%d slots for 2 addresses", len(s.slot))
	}

	dial := func(addr string, tagged bool) net.Conn {
		t.Helper()
		var dl net.Dialer
		if tagged {
			dl.Control = d.TagBackend
		}
		c, err := dl.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	probe := dial(lns[0].Addr().String(), false)
	c0 := dial(lns[0].Addr().String(), true)
	c1 := dial(lns[1].Addr().String(), true)
	c1b := dial(lns[1].Addr().String(), true)
	for _, tc := range []struct {
		service, ep int
		want        uint64
	}{{1, 0, 1}, {2, 5, 1}, {1, 1, 2}} {
		waitConns(tc.service, tc.ep, tc.want)
	}
	for _, c := range []net.Conn{probe, c0, c1, c1b} {
		c.Close()
	}
	for _, tc := range []struct{ service, ep int }{{1, 0}, {2, 5}, {1, 1}} {
		waitConns(tc.service, tc.ep, 0)
	}

	// Rule 1 goes: the shared address stays for rule 2, the other leaves.
	s.remove(1, 0)
	s.remove(1, 1)
	if _, err := s.activeConns(1, 0); err == nil {
		t.Fatal("a removed endpoint is still in the load map")
	}
	if len(s.slot) != 1 || conns(2, 5) != 0 {
		t.Fatalf("after removing rule 1: %d slots", len(s.slot))
	}
	// An endpoint index that moves to another address follows it.
	moved := eps[1]
	moved.Idx = 5
	s.set(2, moved)
	if len(s.slot) != 1 || s.addrOf[endpointRef{2, 5}].String() != lns[1].Addr().String() {
		t.Fatalf("endpoint moved to %s: slots %v", lns[1].Addr(), s.slot)
	}
	c := dial(lns[1].Addr().String(), true)
	waitConns(2, 5, 1)
	c.Close()
	waitConns(2, 5, 0)
	s.remove(2, 5)
	if len(s.slot) != 0 || len(s.users) != 0 || len(s.addrOf) != 0 {
		t.Fatalf("leftovers: %v %v %v", s.slot, s.users, s.addrOf)
	}
}
