package main

import (
	"log/slog"
	"strings"
	"testing"
)

func TestOpenAPISecurityDefaults(t *testing.T) {
	tests := []struct {
		name     string
		f        daemonFlags
		insecure bool
		err      string
	}{
		{"loopback needs nothing", daemonFlags{api: "127.0.0.1:11111"}, false, ""},
		{"localhost is loopback", daemonFlags{api: "localhost:11111"}, false, ""},
		{"IPv6 loopback", daemonFlags{api: "[::1]:11111"}, false, ""},
		{"wildcard refused", daemonFlags{api: ":11111"}, false, "reachable beyond loopback"},
		{"a name may resolve anywhere", daemonFlags{api: "gateway.example:11111"}, false, "reachable beyond loopback"},
		{"wildcard with --api-insecure", daemonFlags{api: "0.0.0.0:11111", apiInsecure: true}, true, ""},
		{"a client CA without TLS", daemonFlags{api: "127.0.0.1:1", apiClientCA: "ca.pem"}, false, "--api-client-ca needs --api-tls-cert"},
		{"a bad --api", daemonFlags{api: "nope"}, false, `--api "nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sec, err := openAPISecurity(tc.f, slog.New(slog.DiscardHandler))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sec.insecure != tc.insecure {
				t.Fatalf("insecure = %v", sec.insecure)
			}
		})
	}
}
