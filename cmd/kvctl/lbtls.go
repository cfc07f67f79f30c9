package main

import (
	"github.com/spf13/pflag"

	"github.com/kvgate/kvgate/pkg/config"
)

// lbTLSFlags are loxicmd's TLS flags of create lb: --security and the
// mtls_frontend / mtls_backend members kvgate implements (docs/security.md).
type lbTLSFlags struct {
	security                     string
	clientCertMode, clientCAPath string
	backendVerify                bool
	backendCAPath                string
}

func addLBTLSFlags(f *pflag.FlagSet, t *lbTLSFlags) {
	f.StringVar(&t.security, "security", "", "TLS: none|https (or tls): TLS to clients|e2ehttps (or e2etls): TLS to clients and engines (certificates in kvgate's --tls-cert-dir)")
	f.StringVar(&t.clientCertMode, "mtls-client-cert-mode", "", "client certificates of a TLS rule: disabled|optional|required")
	f.StringVar(&t.clientCAPath, "mtls-client-ca-path", "", "CA bundle (on kvgate's host) that signs client certificates")
	f.BoolVar(&t.backendVerify, "mtls-backend-verify-server", false, "e2ehttps: verify the engines' certificates (kvgate always does)")
	f.StringVar(&t.backendCAPath, "mtls-backend-ca-path", "", "e2ehttps: CA bundle (on kvgate's host) that signs the engines' certificates (empty: system roots)")
}

// apply sets the rule's TLS fields, with loxicmd's spellings of --security.
func (t *lbTLSFlags) apply(a *config.ServiceArguments) error {
	switch t.security {
	case "", "none", "plain":
		a.Security = config.SecurityPlain
	case "https", "tls":
		a.Security = config.SecurityHTTPS
	case "e2ehttps", "e2etls":
		a.Security = config.SecurityE2EHTTPS
	default:
		return badInput("--security %q: allowed values: none, https (tls), e2ehttps (e2etls)", t.security)
	}
	if t.clientCertMode != "" || t.clientCAPath != "" {
		a.MTLSFrontend = &config.MTLSFrontend{ClientCertMode: t.clientCertMode, ClientCAPath: t.clientCAPath}
	}
	if t.backendVerify || t.backendCAPath != "" {
		a.MTLSBackend = &config.MTLSBackend{BackendCAPath: t.backendCAPath}
	}
	return nil
}
