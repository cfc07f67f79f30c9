//go:build linux

package vip

import (
	"bytes"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// testLink makes a network namespace of the test's own with a veth pair
// "kvgvip0"/"kvgvip1" in it (this kernel has no dummy links), and returns a netlink handle into that namespace. Nothing
// outside the namespace is touched, and it vanishes when the handle closes.
func testLink(t *testing.T) *netlink.Handle {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("KVGATE_REQUIRE_BPF") != "" {
			t.Fatal("VIP tests need root (network namespaces)")
		}
		t.Skip("VIP tests need root (network namespaces)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // switches this thread into the new namespace
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); ns.Close() })
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kvgvip0", HardwareAddr: mac}, PeerName: "kvgvip1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	link, err := h.LinkByName("kvgvip0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	return h
}

func onDevice(t *testing.T, h *netlink.Handle) []string {
	t.Helper()
	link, err := h.LinkByName("kvgvip0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue // the kernel's own fe80:: address
		}
		out = append(out, a.IPNet.String())
	}
	slices.Sort(out)
	return out
}

func addByHand(t *testing.T, h *netlink.Handle, cidr string) {
	t.Helper()
	link, _ := h.LinkByName("kvgvip0")
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(link, a); err != nil {
		t.Fatal(err)
	}
}

func mustOpen(t *testing.T, h *netlink.Handle, dir string) *Plumber {
	t.Helper()
	p, err := Open(Options{Device: "kvgvip0", StateDir: dir, Handle: h, Announce: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	vipA = netip.MustParseAddr("10.213.7.100")
	vipB = netip.MustParseAddr("10.213.7.101")
	vip6 = netip.MustParseAddr("fd00:213::100")
)

func TestClaimRelease(t *testing.T) {
	type step struct {
		op   string // claim, release, close
		addr netip.Addr
		want []string // addresses on the device afterwards
	}
	tests := []struct {
		name   string
		byHand []string
		steps  []step
	}{
		{"one rule adds and removes", nil, []step{
			{"claim", vipA, []string{"10.213.7.100/32"}},
			{"release", vipA, nil},
		}},
		{"two rules on one VIP", nil, []step{
			{"claim", vipA, []string{"10.213.7.100/32"}},
			{"claim", vipA, []string{"10.213.7.100/32"}},
			{"release", vipA, []string{"10.213.7.100/32"}},
			{"release", vipA, nil},
		}},
		{"IPv6 as /128", nil, []step{
			{"claim", vip6, []string{"fd00:213::100/128"}},
			{"release", vip6, nil},
		}},
		{"an address added by hand stays", []string{"10.213.7.100/32"}, []step{
			{"claim", vipA, []string{"10.213.7.100/32"}},
			{"release", vipA, []string{"10.213.7.100/32"}},
			{"claim", vipA, []string{"10.213.7.100/32"}},
			{"close", netip.Addr{}, []string{"10.213.7.100/32"}},
		}},
		{"close removes only kvgate's", []string{"10.213.7.101/32"}, []step{
			{"claim", vipA, []string{"10.213.7.100/32", "10.213.7.101/32"}},
			{"claim", vipB, []string{"10.213.7.100/32", "10.213.7.101/32"}},
			{"close", netip.Addr{}, []string{"10.213.7.101/32"}},
		}},
		{"release of an unclaimed address is a no-op", nil, []step{
			{"release", vipA, nil},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := testLink(t)
			for _, c := range tc.byHand {
				addByHand(t, h, c)
			}
			p := mustOpen(t, h, t.TempDir())
			for i, s := range tc.steps {
				var err error
				switch s.op {
				case "claim":
					err = p.Claim(s.addr)
				case "release":
					err = p.Release(s.addr)
				case "close":
					err = p.Close()
				}
				if err != nil {
					t.Fatalf("step %d %s %s: %v", i, s.op, s.addr, err)
				}
				if got := onDevice(t, h); !slices.Equal(got, s.want) {
					t.Fatalf("step %d %s %s: device has %v, want %v", i, s.op, s.addr, got, s.want)
				}
			}
		})
	}
}

// A kvgate that dies holding VIPs must, on restart, neither leak the VIPs
// whose rules are gone nor take addresses it never added.
func TestCrashRecovery(t *testing.T) {
	h := testLink(t)
	dir := t.TempDir()
	addByHand(t, h, "10.213.7.200/32")
	p1 := mustOpen(t, h, dir)
	for _, a := range []netip.Addr{vipA, vipB, netip.MustParseAddr("10.213.7.200")} {
		if err := p1.Claim(a); err != nil {
			t.Fatal(err)
		}
	}
	// Crash: p1 is dropped without Close. Its record names A and B only.
	rec, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(rec); !strings.Contains(got, "10.213.7.100") || !strings.Contains(got, "10.213.7.101") || strings.Contains(got, "10.213.7.200") {
		t.Fatalf("record %s: want A and B, not the hand-added address", got)
	}

	p2 := mustOpen(t, h, dir)
	if got := p2.Owned(); !slices.Equal(got, []netip.Addr{vipA, vipB}) {
		t.Fatalf("owned after restart = %v", got)
	}
	// Only A's rule survived the restart.
	if err := p2.Claim(vipA); err != nil {
		t.Fatal(err)
	}
	if err := p2.Claim(netip.MustParseAddr("10.213.7.200")); err != nil {
		t.Fatal(err)
	}
	if err := p2.Prune(); err != nil {
		t.Fatal(err)
	}
	if got, want := onDevice(t, h), []string{"10.213.7.100/32", "10.213.7.200/32"}; !slices.Equal(got, want) {
		t.Fatalf("after prune: %v, want %v", got, want)
	}
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := onDevice(t, h), []string{"10.213.7.200/32"}; !slices.Equal(got, want) {
		t.Fatalf("after close: %v, want %v", got, want)
	}
	// A recorded address someone removed meanwhile is dropped, not re-added.
	p3 := mustOpen(t, h, dir)
	if err := p3.Claim(vipB); err != nil {
		t.Fatal(err)
	}
	link, _ := h.LinkByName("kvgvip0")
	if err := h.AddrDel(link, hostAddr(vipB)); err != nil {
		t.Fatal(err)
	}
	p4 := mustOpen(t, h, dir)
	if got := p4.Owned(); len(got) != 0 {
		t.Fatalf("owned = %v after the address vanished", got)
	}
}

func TestOpenErrors(t *testing.T) {
	h := testLink(t)
	tests := []struct {
		name, record, device, want string
	}{
		{"no such device", "", "nope0", `--vip-dev "nope0"`},
		{"corrupt record", "{", "kvgvip0", StateFile},
		{"bad address in record", `{"device":"kvgvip0","owned":["10.1.1"]}`, "kvgvip0", `owned address "10.1.1"`},
		{"empty device", "", "", "empty device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.record != "" {
				if err := os.WriteFile(filepath.Join(dir, StateFile), []byte(tc.record), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Open(Options{Device: tc.device, StateDir: dir, Handle: h})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
	t.Run("record of another device is ignored", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, StateFile), []byte(`{"device":"eth9","owned":["10.213.7.100"]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := Open(Options{Device: "kvgvip0", StateDir: dir, Handle: h})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Owned(); len(got) != 0 {
			t.Fatalf("owned = %v", got)
		}
	})
	t.Run("unspecified address refused", func(t *testing.T) {
		p := mustOpen(t, h, t.TempDir())
		if err := p.Claim(netip.MustParseAddr("0.0.0.0")); err == nil {
			t.Fatal("0.0.0.0 claimed")
		}
	})
}

func TestGARPFrame(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	got := garpFrame(mac, netip.MustParseAddr("10.213.7.100"))
	want, _ := hex.DecodeString("ffffffffffff" + "020000000001" + "0806" + // Ethernet
		"0001" + "0800" + "06" + "04" + "0001" + // ARP request, Ethernet/IPv4
		"020000000001" + "0ad50764" + "000000000000" + "0ad50764") // sender = target = VIP
	if !bytes.Equal(got, want) {
		t.Fatalf("frame\n got %x\nwant %x", got, want)
	}
}
