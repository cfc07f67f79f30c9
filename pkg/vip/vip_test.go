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
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// testLink makes a network namespace of the test's own with a veth pair
// "kvgvip0"/"kvgvip1" in it (this kernel has no dummy links), and returns a netlink handle into that namespace. Nothing
// outside the namespace is touched, and it vanishes when the handle closes.
func testLink(t *testing.T) *netlink.Handle {
	t.Helper()
	h, ns := testNS(t)
	lastNS[h] = ns
	t.Cleanup(func() { delete(lastNS, h) })
	return h
}

// lastNS maps a test's handle to its namespace (tests in this package do not
// run in parallel).
var lastNS = map[*netlink.Handle]netns.NsHandle{}

// peerCapture opens a packet socket on ifindex inside ns, with a short
// receive timeout, for reading what arrives on the veth peer.
func peerCapture(t *testing.T, ns netns.NsHandle, ifindex int) int {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netns.Set(orig) }()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

// testNS makes the namespace and its veth pair.
func testNS(t *testing.T) (*netlink.Handle, netns.NsHandle) {
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
	return h, ns
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
	ns := lastNS[h]
	p, err := Open(Options{Device: "kvgvip0", StateDir: dir, Handle: h, Namespace: &ns, Announce: true})
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

func TestUnsolicitedNA(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	got := unsolicitedNA(mac, netip.MustParseAddr("fd00:213::100"))
	want, _ := hex.DecodeString("88000000" + "20000000" + "fd000213000000000000000000000100" + "0201" + "020000000001")
	if !bytes.Equal(got, want) {
		t.Fatalf("message\n got %x\nwant %x", got, want)
	}
}

// TestAnnounceReachesThePeer claims an IPv4 and an IPv6 VIP with Announce on
// and reads, on the veth peer, the gratuitous ARP and the neighbour
// advertisement that arrive.
func TestAnnounceReachesThePeer(t *testing.T) {
	h := testLink(t)
	peer, err := h.LinkByName("kvgvip1")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	fd := peerCapture(t, lastNS[h], peer.Attrs().Index)
	// A neighbour advertisement needs a source: wait until the link-local
	// address has passed duplicate address detection, as on any long-up link.
	link, _ := h.LinkByName("kvgvip0")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		addrs, _ := h.AddrList(link, netlink.FAMILY_V6)
		ready := false
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				ready = true
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the link-local address stayed tentative")
		}
	}
	p := mustOpen(t, h, t.TempDir())
	for _, a := range []netip.Addr{vipA, vip6} {
		if err := p.Claim(a); err != nil {
			t.Fatal(err)
		}
	}
	var sawARP, sawNA bool
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !(sawARP && sawNA); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue // the receive timeout: look again until the deadline
		}
		f := buf[:n]
		switch {
		case len(f) >= 42 && f[12] == 0x08 && f[13] == 0x06 && bytes.Equal(f[28:32], vipA.AsSlice()) && bytes.Equal(f[38:42], vipA.AsSlice()):
			sawARP = true
		case len(f) >= 14+40+24 && f[12] == 0x86 && f[13] == 0xdd && f[14+6] == 58 && f[14+40] == 136 &&
			bytes.Equal(f[14+40+8:14+40+24], vip6.AsSlice()):
			sawNA = true
		}
	}
	if !sawARP || !sawNA {
		t.Fatalf("on the peer: gratuitous ARP %v, neighbour advertisement %v", sawARP, sawNA)
	}
}

// TestClaimOnLoopback: lo works as --vip-dev too (a VIP behind ECMP or BGP
// lives there); it has no Ethernet address, so nothing is announced.
func TestClaimOnLoopback(t *testing.T) {
	h := testLink(t)
	ns := lastNS[h]
	p, err := Open(Options{Device: "lo", StateDir: t.TempDir(), Handle: h, Namespace: &ns, Announce: true})
	if err != nil {
		t.Fatal(err)
	}
	lo, _ := h.LinkByName("lo")
	has := func() bool {
		addrs, _ := h.AddrList(lo, netlink.FAMILY_V4)
		for _, a := range addrs {
			if a.IPNet.String() == "10.213.7.100/32" {
				return true
			}
		}
		return false
	}
	if err := p.Claim(vipA); err != nil || !has() {
		t.Fatalf("claim on lo: %v, on lo: %v", err, has())
	}
	if err := p.Release(vipA); err != nil || has() {
		t.Fatalf("release on lo: %v, still on lo: %v", err, has())
	}
}
