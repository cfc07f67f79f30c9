package config

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Address checks: a rule must not make kvgate send traffic where no engine
// can be (unspecified, link-local, multicast, broadcast) or back into kvgate
// itself (its management API, or any rule's VIP including its own), because
// a VIP that forwards to itself loops until file descriptors run out, and an
// endpoint on the API lets anyone who reaches the data plane rewrite rules.
// docs/api.md "Addresses" lists the checks.
//
// Source allow-lists (CIDRs per rule) belong here too: checkEndpointAddr and
// checkVIPAddr are the only places a rule's addresses are judged.

// Listeners describes kvgate's own listening sockets at the time a rule is
// checked.
type Listeners struct {
	// API is the management API's bound address (invalid when unknown).
	API netip.AddrPort
	// VIPs are the other rules' listeners; the checked rule's own VIP is
	// taken from the rule itself.
	VIPs []netip.AddrPort
	// Local reports whether an address belongs to this host. Nil: loopback
	// addresses only (HostAddrs gives the interface view).
	Local func(netip.Addr) bool
	// Broadcast reports whether an address is a directed broadcast address
	// of a local subnet (255.255.255.255 is always refused). Nil: none.
	Broadcast func(netip.Addr) bool
}

// directedBroadcast is the IPv4 directed-broadcast address of ip's subnet
// under mask; false for IPv6 and for /31 and /32, which have none.
func directedBroadcast(ip netip.Addr, mask net.IPMask) (netip.Addr, bool) {
	if !ip.Is4() {
		return netip.Addr{}, false
	}
	ones, bits := mask.Size()
	if bits != 32 || ones >= 31 {
		return netip.Addr{}, false
	}
	b := ip.As4()
	m := net.CIDRMask(ones, 32)
	for i := range b {
		b[i] |= ^m[i]
	}
	return netip.AddrFrom4(b), true
}

// HostAddrs snapshots the host's interface addresses and their IPv4
// directed-broadcast addresses, for Listeners.Local and Listeners.Broadcast.
// Loopback addresses count as local even when no interface lists them
// (Linux answers all of 127.0.0.0/8).
func HostAddrs() (local, broadcast func(netip.Addr) bool) {
	locals := map[netip.Addr]bool{}
	bcasts := map[netip.Addr]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			locals[ip] = true
			if b, ok := directedBroadcast(ip, ipn.Mask); ok {
				bcasts[b] = true
			}
		}
	}
	local = func(a netip.Addr) bool { a = a.Unmap(); return a.IsLoopback() || locals[a] }
	broadcast = func(a netip.Addr) bool { return bcasts[a.Unmap()] }
	return local, broadcast
}

func (l Listeners) isLocal(a netip.Addr) bool {
	if l.Local != nil {
		return l.Local(a)
	}
	return a.Unmap().IsLoopback()
}

// matches reports whether a connection to dst would reach listener ln: the
// same ip:port, or the same port on a local address when ln is a wildcard
// bind (0.0.0.0 or ::; Linux's :: also takes IPv4).
func (l Listeners) matches(ln, dst netip.AddrPort) bool {
	if !ln.IsValid() || ln.Port() != dst.Port() {
		return false
	}
	la, da := ln.Addr().Unmap(), dst.Addr().Unmap()
	if la.IsUnspecified() {
		return da.IsUnspecified() || l.isLocal(da)
	}
	return la == da
}

// WildcardVIP reports whether ip is an unspecified address (0.0.0.0 or ::).
func WildcardVIP(ip string) bool {
	a, err := netip.ParseAddr(strings.TrimSpace(ip))
	return err == nil && a.Unmap().IsUnspecified()
}

// CheckAddresses applies the address checks to a rule that passed Validate.
// self describes kvgate's own listeners. The error is a *ValidationError
// naming the field.
func CheckAddresses(r *Rule, self Listeners) error {
	vipAddr, err := netip.ParseAddr(strings.TrimSpace(r.Args.ExternalIP))
	if err != nil {
		return invalid("serviceArguments.externalIP", "%q is not an IP address", r.Args.ExternalIP)
	}
	vip := netip.AddrPortFrom(vipAddr.Unmap(), uint16(r.Args.Port))
	if err := checkVIPAddr(r, vip, self); err != nil {
		return err
	}
	for i, e := range r.Endpoints {
		a, err := netip.ParseAddr(strings.TrimSpace(e.IP))
		if err != nil {
			return invalid(fmt.Sprintf("endpoints[%d].endpointIP", i), "%q is not an IP address", e.IP)
		}
		if err := checkEndpointAddr(i, netip.AddrPortFrom(a.Unmap(), uint16(e.TargetPort)), vip, self); err != nil {
			return err
		}
	}
	return nil
}

func checkVIPAddr(r *Rule, vip netip.AddrPort, self Listeners) error {
	const field = "serviceArguments.externalIP"
	a := vip.Addr()
	switch {
	case a.IsUnspecified():
		if !r.Args.WildcardVIP {
			return invalid(field, "%s binds every interface of the host; set serviceArguments.wildcardVip: true to mean it, or give the address to listen on", a)
		}
	case r.Args.WildcardVIP:
		return invalid("serviceArguments.wildcardVip", "true needs externalIP 0.0.0.0 or ::; got %s", a)
	case a.IsMulticast():
		return invalid(field, "%s is a multicast address; a VIP must be a unicast address", a)
	case a.Is4() && (a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || (self.Broadcast != nil && self.Broadcast(a))):
		return invalid(field, "%s is a broadcast address; a VIP must be a unicast address", a)
	}
	if self.matches(self.API, vip) || self.matches(vip, self.API) {
		return invalid(field, "%s overlaps kvgate's management API on %s; choose another address or port", vip, self.API)
	}
	return nil
}

func checkEndpointAddr(i int, dst, vip netip.AddrPort, self Listeners) error {
	field := fmt.Sprintf("endpoints[%d].endpointIP", i)
	a := dst.Addr()
	switch {
	case a.IsUnspecified():
		return invalid(field, "%s is the unspecified address (a connection to it reaches this host); give the engine's address", a)
	case a.IsLinkLocalUnicast():
		return invalid(field, "%s is link-local (169.254.0.0/16, fe80::/10: instance metadata and zeroconf, not engines); give a routable address", a)
	case a.IsMulticast():
		return invalid(field, "%s is a multicast address (224.0.0.0/4, ff00::/8); an endpoint must be a unicast address", a)
	case a.Is4() && (a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || (self.Broadcast != nil && self.Broadcast(a))):
		return invalid(field, "%s is a broadcast address; an endpoint must be a unicast address", a)
	}
	if self.matches(vip, dst) {
		return invalid(field, "%s is this rule's own VIP (%s); kvgate would forward the rule to itself in a loop", dst, vip)
	}
	if self.matches(self.API, dst) {
		return invalid(field, "%s is kvgate's management API (listening on %s); a rule must not expose the API through its VIP", dst, self.API)
	}
	for _, ln := range self.VIPs {
		if self.matches(ln, dst) {
			return invalid(field, "%s is the VIP of another kvgate rule (listening on %s); chaining rules can loop, point the endpoint at the engine itself", dst, ln)
		}
	}
	return nil
}
