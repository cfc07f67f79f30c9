package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestListenerMatching: a listener matches a destination with the same
// ip:port; a wildcard bind (0.0.0.0 or ::, which takes IPv4 on Linux)
// matches every local address on its port and nothing else.
func TestListenerMatching(t *testing.T) {
	local := func(a netip.Addr) bool { return a.IsLoopback() || a == netip.MustParseAddr("198.51.100.7") }
	l := Listeners{Local: local}
	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		ln, dst string
		want    bool
	}{
		{"127.0.0.1:11111", "127.0.0.1:11111", true},
		{"127.0.0.1:11111", "127.0.0.1:11112", false},
		{"127.0.0.1:11111", "127.0.0.2:11111", false},
		{"0.0.0.0:11111", "127.0.0.2:11111", true},
		{"0.0.0.0:11111", "198.51.100.7:11111", true},
		{"0.0.0.0:11111", "198.51.100.8:11111", false},
		{"[::]:11111", "127.0.0.1:11111", true},
		{"[::]:11111", "[::1]:11111", true},
		{"[::]:11111", "[2001:db8::1]:11111", false},
		{"[::1]:80", "[::1]:80", true},
	} {
		if got := l.matches(ap(c.ln), ap(c.dst)); got != c.want {
			t.Errorf("listener %s, destination %s: match %v, want %v", c.ln, c.dst, got, c.want)
		}
	}
}

// TestCheckAddressesFields: each refusal names the offending field.
func TestCheckAddressesFields(t *testing.T) {
	self := Listeners{API: netip.MustParseAddrPort("127.0.0.1:11111"), VIPs: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:80")}}
	for _, c := range []struct {
		name  string
		edit  func(r *Rule)
		field string
	}{
		{"api", func(r *Rule) { r.Endpoints[1].IP, r.Endpoints[1].TargetPort = "127.0.0.1", 11111 }, "endpoints[1].endpointIP"},
		{"other VIP", func(r *Rule) { r.Endpoints[0].IP, r.Endpoints[0].TargetPort = "10.0.0.2", 80 }, "endpoints[0].endpointIP"},
		{"own VIP", func(r *Rule) { r.Endpoints[0].IP, r.Endpoints[0].TargetPort = "10.10.10.254", 8080 }, "endpoints[0].endpointIP"},
		{"wildcard", func(r *Rule) { r.Args.ExternalIP = "0.0.0.0" }, "serviceArguments.externalIP"},
		{"ipv6 link-local", func(r *Rule) { r.Endpoints[0].IP = "fe80::abcd" }, "endpoints[0].endpointIP"},
		{"ipv6 multicast", func(r *Rule) { r.Endpoints[1].IP = "ff05::2" }, "endpoints[1].endpointIP"},
	} {
		r := baseKVRule()
		c.edit(r)
		err := CheckAddresses(r, self)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !strings.HasPrefix(ve.Msg, c.field+": ") {
			t.Errorf("%s: %v, want a ValidationError naming %s", c.name, err, c.field)
		}
	}
	if err := CheckAddresses(baseKVRule(), self); err != nil {
		t.Errorf("the base rule: %v", err)
	}
}
