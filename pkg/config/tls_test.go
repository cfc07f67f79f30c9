package config

import (
	"errors"
	"strings"
	"testing"
)

func tlsRule(edit func(r *Rule)) *Rule {
	r := baseKVRule()
	r.Args.Security = SecurityHTTPS
	r.Args.ProbeType = ProbeTCP
	edit(r)
	return r
}

// TestValidateTLS: LoxiLB's security, mtls_frontend and mtls_backend shapes
// are accepted where kvgate implements them and refused, naming the field,
// where it does not.
func TestValidateTLS(t *testing.T) {
	no := false
	yes := true
	cases := []struct {
		name  string
		edit  func(r *Rule)
		field string // "" means valid
		words string
	}{
		{"https", func(*Rule) {}, "", ""},
		{"e2ehttps", func(r *Rule) { r.Args.Security = SecurityE2EHTTPS }, "", ""},
		{"e2ehttps with a CA", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.MTLSBackend = &MTLSBackend{VerifyServerCert: &yes, BackendCAPath: "/etc/kvgate/engines-ca.crt"}
		}, "", ""},
		{"mtls required", func(r *Rule) {
			r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired, ClientCAPath: "/etc/ca.crt"}
		}, "", ""},
		{"mtls optional", func(r *Rule) {
			r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertOptional, ClientCAPath: "/etc/ca.crt"}
		}, "", ""},
		{"mtls disabled", func(r *Rule) { r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertDisabled} }, "", ""},
		{"https needs fullproxy", func(r *Rule) { *r = Rule{Args: ServiceArguments{ExternalIP: "1.1.1.1", Port: 1, Security: 1}} }, "serviceArguments.mode", "mode 4"},
		{"mtls on plain", func(r *Rule) {
			r.Args.Security = 0
			r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired, ClientCAPath: "/ca"}
		}, "serviceArguments.mtls_frontend", "security 1"},
		{"mode require (not LoxiLB's)", func(r *Rule) { r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: "require", ClientCAPath: "/ca"} }, "serviceArguments.mtls_frontend.client_cert_mode", "disabled, optional, required"},
		{"required without CA", func(r *Rule) { r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired} }, "serviceArguments.mtls_frontend.client_ca_path", "required"},
		{"relative CA", func(r *Rule) {
			r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired, ClientCAPath: "ca.crt"}
		}, "serviceArguments.mtls_frontend.client_ca_path", "absolute"},
		{"CA without a mode", func(r *Rule) { r.Args.MTLSFrontend = &MTLSFrontend{ClientCAPath: "/ca"} }, "serviceArguments.mtls_frontend.client_ca_path", "disabled"},
		{"CN pattern", func(r *Rule) {
			r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired, ClientCAPath: "/ca", RequireClientCN: true, ClientCNPattern: "*.corp"}
		}, "serviceArguments.mtls_frontend.require_client_cn", "not supported"},
		{"CRL", func(r *Rule) {
			r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired, ClientCAPath: "/ca", ClientCRLPath: "/crl"}
		}, "serviceArguments.mtls_frontend.client_crl_path", "not supported"},
		// kvgate's own calls to security-2 engines speak https
		// (pkg/engineclient), so http probes and a backend key are allowed.
		{"e2ehttps with http probes", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.ProbeType = ""
		}, "", ""},
		{"e2ehttps with explicit http probes", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.ProbeType = ProbeHTTP
		}, "", ""},
		{"e2ehttps with a backend token file", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.BackendTokenFile = "/etc/kvgate/backend-tokens/k"
		}, "", ""},
		{"backend on https", func(r *Rule) { r.Args.MTLSBackend = &MTLSBackend{BackendCAPath: "/ca"} }, "serviceArguments.mtls_backend", "security 2"},
		{"backend unverified", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.MTLSBackend = &MTLSBackend{VerifyServerCert: &no}
		}, "serviceArguments.mtls_backend.verify_server_cert", "always verifies"},
		{"backend client cert", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.MTLSBackend = &MTLSBackend{ClientCertPath: "/c", ClientKeyPath: "/k"}
		}, "serviceArguments.mtls_backend.client_cert_path", "not supported"},
		{"relative backend CA", func(r *Rule) {
			r.Args.Security = SecurityE2EHTTPS
			r.Args.MTLSBackend = &MTLSBackend{BackendCAPath: "ca.crt"}
		}, "serviceArguments.mtls_backend.backend_ca_path", "absolute"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(tlsRule(c.edit), Settings{})
			if c.field == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(ve.Msg, c.words) {
				t.Fatalf("want a ValidationError on %s mentioning %q, got %v", c.field, c.words, err)
			}
		})
	}
}

// TestCheckUpdateTLS: a running rule keeps its TLS settings; changing them
// is a conflict, an identical re-post is not.
func TestCheckUpdateTLS(t *testing.T) {
	yes := true
	base := tlsRule(func(r *Rule) {
		r.Args.Security = SecurityE2EHTTPS
		r.Args.MTLSFrontend = &MTLSFrontend{ClientCertMode: ClientCertRequired, ClientCAPath: "/ca"}
		r.Args.MTLSBackend = &MTLSBackend{BackendCAPath: "/eca"}
	})
	cases := []struct {
		name     string
		edit     func(r *Rule)
		conflict string
	}{
		{"same", func(*Rule) {}, ""},
		{"verify spelled out", func(r *Rule) { r.Args.MTLSBackend.VerifyServerCert = &yes }, ""},
		{"security", func(r *Rule) { r.Args.Security = SecurityHTTPS }, "serviceArguments.security"},
		{"client mode", func(r *Rule) { r.Args.MTLSFrontend.ClientCertMode = ClientCertOptional }, "serviceArguments.mtls_frontend"},
		{"frontend removed", func(r *Rule) { r.Args.MTLSFrontend = nil }, "serviceArguments.mtls_frontend"},
		{"backend CA", func(r *Rule) { r.Args.MTLSBackend.BackendCAPath = "/other" }, "serviceArguments.mtls_backend"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			upd := base.Clone()
			c.edit(upd)
			err := CheckUpdate(base, upd)
			if c.conflict == "" {
				if err != nil {
					t.Fatalf("want no conflict, got %v", err)
				}
				return
			}
			var ce *ConflictError
			if !errors.As(err, &ce) || !strings.HasPrefix(ce.Msg, c.conflict) {
				t.Fatalf("want a conflict on %s, got %v", c.conflict, err)
			}
		})
	}
	// Clone copies the TLS objects: editing the clone leaves the original.
	c := base.Clone()
	c.Args.MTLSFrontend.ClientCAPath = "/changed"
	if base.Args.MTLSFrontend.ClientCAPath != "/ca" {
		t.Fatal("Clone shares mtls_frontend")
	}
}

func TestTLSCertDir(t *testing.T) {
	r := &Rule{Args: ServiceArguments{ExternalIP: "fd00:0::1", Port: 443}}
	if got := r.TLSCertDir("/etc/kvgate/tls"); got != "/etc/kvgate/tls/fd00::1_443" {
		t.Fatalf("got %s", got)
	}
}
