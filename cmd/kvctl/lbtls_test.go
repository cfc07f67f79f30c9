package main

import (
	"strings"
	"testing"
)

// TestCreateLBTLSFlags: loxicmd's --security spellings and mTLS flags reach
// the rule as LoxiLB's fields; a value kvctl does not know exits 2.
func TestCreateLBTLSFlags(t *testing.T) {
	ts := startAPI(t)
	base := []string{"create", "lb", "10.10.10.20", "--tcp=443:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--probetype=tcp"}
	cases := []struct {
		name  string
		args  []string
		code  int
		wants []string
	}{
		{"https with required client certificates", []string{"--security=https", "--mtls-client-cert-mode=required", "--mtls-client-ca-path=/etc/kvgate/clients.crt"}, 0,
			[]string{`"security":1`, `"mtls_frontend":{"client_cert_mode":"required","client_ca_path":"/etc/kvgate/clients.crt"}`}},
		{"e2etls with an engine CA", []string{"--security=e2etls", "--mtls-backend-verify-server", "--mtls-backend-ca-path=/etc/kvgate/engines.crt"}, 0,
			[]string{`"security":2`, `"mtls_backend":{"backend_ca_path":"/etc/kvgate/engines.crt"}`}},
		{"unknown security", []string{"--security=ssl"}, 2, []string{"--security", "e2ehttps"}},
		{"client CA without TLS", []string{"--mtls-client-cert-mode=required", "--mtls-client-ca-path=/ca"}, 1, []string{"API error 400", "mtls_frontend"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code, err := kvctl(t, ts.URL, append(append([]string{}, base...), c.args...)...)
			if code != c.code {
				t.Fatalf("exit %d (want %d): %v %s", code, c.code, err, out)
			}
			got := out
			if err != nil {
				got += err.Error()
			}
			if c.code == 0 {
				got = getAll(t, ts.URL)
				if _, code, err := kvctl(t, ts.URL, "delete", "lb", "10.10.10.20", "--tcp=443"); code != 0 {
					t.Fatalf("delete: %v", err)
				}
			}
			for _, w := range c.wants {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in %s", w, got)
				}
			}
		})
	}
}
