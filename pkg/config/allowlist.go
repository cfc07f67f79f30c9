package config

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParseCIDRs reads --endpoint-cidrs: a comma-separated list of IPv4/IPv6
// prefixes (a bare address means that one address). Empty allows any.
func ParseCIDRs(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("%q is not a CIDR or an address", f)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR: %w", f, err)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// CheckEndpointCIDRs refuses a rule with an endpoint outside allowed (nil or
// empty allows any). The engine's KV-event PUB and replay sockets are on the
// endpoint's address, so they are held to the same ranges.
func CheckEndpointCIDRs(r *Rule, allowed []netip.Prefix) error {
	if len(allowed) == 0 {
		return nil
	}
	for i, e := range r.Endpoints {
		a, err := netip.ParseAddr(strings.TrimSpace(e.IP))
		if err != nil {
			return invalid(fmt.Sprintf("endpoints[%d].endpointIP", i), "%q is not an IP address", e.IP)
		}
		a = a.Unmap()
		ok := false
		for _, p := range allowed {
			if p.Contains(a) {
				ok = true
				break
			}
		}
		if !ok {
			return invalid(fmt.Sprintf("endpoints[%d].endpointIP", i),
				"%s is outside the endpoint ranges this kvgate allows (--endpoint-cidrs %s)", a, prefixList(allowed))
		}
	}
	return nil
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
