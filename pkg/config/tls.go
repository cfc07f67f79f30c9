package config

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
)

// LoxiLB's serviceArguments.security values (docs/security.md, "TLS
// termination on the data plane").
const (
	SecurityPlain    = 0 // plain HTTP
	SecurityHTTPS    = 1 // TLS to clients, plain HTTP to the engines
	SecurityE2EHTTPS = 2 // TLS to clients and to the engines
)

// LoxiLB's mtls_frontend.client_cert_mode values.
const (
	ClientCertDisabled = "disabled"
	ClientCertOptional = "optional"
	ClientCertRequired = "required"
)

// MTLSFrontend is LoxiLB's mtls_frontend object: whether clients must
// present a certificate, and the CA that signs them. The members kvgate does
// not implement are declared so that a rule naming them is refused instead of
// being served without the check it asked for.
type MTLSFrontend struct {
	ClientCertMode string `json:"client_cert_mode,omitempty"`
	ClientCAPath   string `json:"client_ca_path,omitempty"`

	ClientCACertData string `json:"client_ca_cert_data,omitempty"`
	RequireClientCN  bool   `json:"require_client_cn,omitempty"`
	ClientCNPattern  string `json:"client_cn_pattern,omitempty"`
	ClientCRLPath    string `json:"client_crl_path,omitempty"`
}

// MTLSBackend is LoxiLB's mtls_backend object for security 2: the CA the
// engines' certificates are verified against (empty: the system's roots).
// kvgate always verifies, so verify_server_cert may only be true or absent.
type MTLSBackend struct {
	VerifyServerCert *bool  `json:"verify_server_cert,omitempty"`
	BackendCAPath    string `json:"backend_ca_path,omitempty"`

	ClientCertPath string `json:"client_cert_path,omitempty"`
	ClientKeyPath  string `json:"client_key_path,omitempty"`
	ClientCertData string `json:"client_cert_data,omitempty"`
	ClientKeyData  string `json:"client_key_data,omitempty"`
}

func (m *MTLSFrontend) clone() *MTLSFrontend {
	if m == nil {
		return nil
	}
	c := *m
	return &c
}

func (m *MTLSBackend) clone() *MTLSBackend {
	if m == nil {
		return nil
	}
	c := *m
	if m.VerifyServerCert != nil {
		v := *m.VerifyServerCert
		c.VerifyServerCert = &v
	}
	return &c
}

// ClientCertMode is the rule's effective client-certificate mode.
func (r *Rule) ClientCertMode() string {
	if r.Args.MTLSFrontend == nil || r.Args.MTLSFrontend.ClientCertMode == "" {
		return ClientCertDisabled
	}
	return r.Args.MTLSFrontend.ClientCertMode
}

// TerminatesTLS reports whether kvgate speaks TLS to the rule's clients.
func (r *Rule) TerminatesTLS() bool { return r.Args.Security >= SecurityHTTPS }

// BackendTLS reports whether kvgate speaks TLS to the rule's engines.
func (r *Rule) BackendTLS() bool { return r.Args.Security == SecurityE2EHTTPS }

// TLSCertDir is the directory holding the rule's certificate under
// --tls-cert-dir: <certDir>/<vip>_<port> (docs/security.md).
func (r *Rule) TLSCertDir(certDir string) string {
	vip := r.Args.ExternalIP
	if ip := net.ParseIP(vip); ip != nil {
		vip = ip.String()
	}
	return filepath.Join(certDir, vip+"_"+strconv.Itoa(r.Args.Port))
}

// validateTLS checks security, mtls_frontend and mtls_backend against what
// kvgate implements; the files themselves are checked when the rule starts.
func validateTLS(r *Rule) error {
	a := &r.Args
	switch a.Security {
	case SecurityPlain, SecurityHTTPS, SecurityE2EHTTPS:
	default:
		return invalid("serviceArguments.security", "%d is not supported; allowed values: 0 plain HTTP, 1 https (TLS to clients), 2 e2ehttps (TLS to clients and engines)", a.Security)
	}
	if a.Security != SecurityPlain && a.Mode != ModeFullProxy {
		return invalid("serviceArguments.mode", "security %d terminates TLS, which needs mode 4 (fullproxy); got mode %d", a.Security, a.Mode)
	}
	if err := validateMTLSFrontend(a); err != nil {
		return err
	}
	return validateMTLSBackend(a)
}

func validateMTLSFrontend(a *ServiceArguments) error {
	f := a.MTLSFrontend
	if f == nil {
		return nil
	}
	const field = "serviceArguments.mtls_frontend"
	if a.Security == SecurityPlain {
		return invalid(field, "client certificates need TLS: set security 1 (https) or 2 (e2ehttps)")
	}
	unsupported := []struct {
		name string
		set  bool
	}{
		{"client_ca_cert_data", f.ClientCACertData != ""},
		{"require_client_cn", f.RequireClientCN},
		{"client_cn_pattern", f.ClientCNPattern != ""},
		{"client_crl_path", f.ClientCRLPath != ""},
	}
	for _, u := range unsupported {
		if u.set {
			return invalid(field+"."+u.name, "is not supported by kvgate; supported members: client_cert_mode, client_ca_path")
		}
	}
	switch f.ClientCertMode {
	case "", ClientCertDisabled:
		if f.ClientCAPath != "" {
			return invalid(field+".client_ca_path", "is set but client_cert_mode is disabled; set client_cert_mode optional or required, or remove client_ca_path")
		}
	case ClientCertOptional, ClientCertRequired:
		if f.ClientCAPath == "" {
			return invalid(field+".client_ca_path", "is required with client_cert_mode %s: the CA bundle (PEM) that signs client certificates", f.ClientCertMode)
		}
		if !filepath.IsAbs(f.ClientCAPath) {
			return invalid(field+".client_ca_path", "%q must be an absolute path", f.ClientCAPath)
		}
	default:
		return invalid(field+".client_cert_mode", "%q is invalid; allowed values: disabled, optional, required", f.ClientCertMode)
	}
	return nil
}

func validateMTLSBackend(a *ServiceArguments) error {
	b := a.MTLSBackend
	if b == nil {
		return nil
	}
	const field = "serviceArguments.mtls_backend"
	if a.Security != SecurityE2EHTTPS {
		return invalid(field, "applies to TLS towards the engines: set security 2 (e2ehttps)")
	}
	for _, u := range []struct {
		name string
		set  bool
	}{
		{"client_cert_path", b.ClientCertPath != ""},
		{"client_key_path", b.ClientKeyPath != ""},
		{"client_cert_data", b.ClientCertData != ""},
		{"client_key_data", b.ClientKeyData != ""},
	} {
		if u.set {
			return invalid(field+"."+u.name, "is not supported by kvgate (no client certificate towards the engines); supported members: verify_server_cert, backend_ca_path")
		}
	}
	if b.VerifyServerCert != nil && !*b.VerifyServerCert {
		return invalid(field+".verify_server_cert", "false is not supported: kvgate always verifies the engines' certificates (against backend_ca_path, or the system's roots when it is empty)")
	}
	if b.BackendCAPath != "" && !filepath.IsAbs(b.BackendCAPath) {
		return invalid(field+".backend_ca_path", "%q must be an absolute path", b.BackendCAPath)
	}
	return nil
}

// checkTLSUpdate refuses a change of a running rule's TLS settings: its
// listener speaks one protocol for its lifetime (as in LoxiLB, where
// security cannot be patched).
func checkTLSUpdate(old, updated *Rule) error {
	if old.Args.Security != updated.Args.Security {
		return &ConflictError{Msg: fmt.Sprintf("serviceArguments.security: cannot change from %d to %d on an existing rule; delete and recreate the rule", old.Args.Security, updated.Args.Security)}
	}
	if !sameFrontend(old.Args.MTLSFrontend, updated.Args.MTLSFrontend) {
		return &ConflictError{Msg: "serviceArguments.mtls_frontend: cannot change on an existing rule; delete and recreate the rule"}
	}
	if !sameBackend(old.Args.MTLSBackend, updated.Args.MTLSBackend) {
		return &ConflictError{Msg: "serviceArguments.mtls_backend: cannot change on an existing rule; delete and recreate the rule"}
	}
	return nil
}

func sameFrontend(a, b *MTLSFrontend) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameBackend(a, b *MTLSBackend) bool {
	if a == nil || b == nil {
		return a == b
	}
	verify := func(m *MTLSBackend) bool { return m.VerifyServerCert == nil || *m.VerifyServerCert }
	x, y := *a, *b
	x.VerifyServerCert, y.VerifyServerCert = nil, nil
	return x == y && verify(a) == verify(b)
}
