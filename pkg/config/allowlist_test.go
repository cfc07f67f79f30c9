package config

import (
	"strings"
	"testing"
)

func TestEndpointCIDRs(t *testing.T) {
	allowed, err := ParseCIDRs(" 10.20.0.0/16, fd00:1::/64 ,192.0.2.7,::ffff:10.30.0.0/112")
	if err != nil {
		t.Fatal(err)
	}
	if got := prefixList(allowed); got != "10.20.0.0/16,fd00:1::/64,192.0.2.7/32,10.30.0.0/16" {
		t.Fatalf("parsed %s", got)
	}
	tests := []struct {
		ip, err string
	}{
		{"10.20.3.4", ""},
		{"::ffff:10.20.3.4", ""},
		{"fd00:1::9", ""},
		{"192.0.2.7", ""},
		{"10.30.255.1", ""},
		{"10.21.0.1", "endpoints[1].endpointIP: 10.21.0.1 is outside the endpoint ranges this kvgate allows (--endpoint-cidrs 10.20.0.0/16,fd00:1::/64,192.0.2.7/32,10.30.0.0/16)"},
		{"192.0.2.8", "is outside"},
		{"fd00:2::1", "is outside"},
	}
	for _, tc := range tests {
		r := &Rule{Endpoints: []Endpoint{{IP: "10.20.0.1", TargetPort: 1}, {IP: tc.ip, TargetPort: 1}}}
		err := CheckEndpointCIDRs(r, allowed)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: err %v, want %q", tc.ip, err, tc.err)
		}
	}
	if err := CheckEndpointCIDRs(&Rule{Endpoints: []Endpoint{{IP: "8.8.8.8"}}}, nil); err != nil {
		t.Errorf("no list allows any: %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "nope", "10.0.0.1/x"} {
		if _, err := ParseCIDRs(bad); err == nil {
			t.Errorf("ParseCIDRs(%q) accepted", bad)
		}
	}
}
