package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvgate/kvgate/pkg/apiauth"
)

// addAPIFlags adds the flags that say where the API is and how to reach it:
// the URL, the CA that signed its certificate, a client certificate (mTLS)
// and the bearer token.
func addAPIFlags(fs *pflag.FlagSet) {
	fs.String("api-server", envOr("KVCTL_API_SERVER", defaultAPIServer), "kvgate management API base URL, http:// or https:// (env KVCTL_API_SERVER)")
	fs.String("cacert", envOr("KVCTL_CACERT", ""), "PEM CA bundle that signed the API's certificate (env KVCTL_CACERT); default: the system's")
	fs.String("cert", envOr("KVCTL_CERT", ""), "client certificate (PEM) for an API that requires mTLS (env KVCTL_CERT)")
	fs.String("key", envOr("KVCTL_KEY", ""), "the --cert key (PEM; env KVCTL_KEY)")
	fs.String("token-file", envOr("KVCTL_TOKEN_FILE", ""), "file holding the API token: the token alone, or a '<name> <role> <token>' line; mode 0600 or 0400 (env KVCTL_TOKEN_FILE)")
}

func flagValue(cmd *cobra.Command, name string) string {
	if f := cmd.Flag(name); f != nil {
		return f.Value.String()
	}
	return ""
}

func newAPIClient(cmd *cobra.Command) (*apiClient, error) {
	base := flagValue(cmd, "api-server")
	if base == "" {
		base = defaultAPIServer
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, badInput("--api-server %q: want a URL such as %s", base, defaultAPIServer)
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSHandshakeTimeout: 10 * time.Second}
	cacert, cert, key := flagValue(cmd, "cacert"), flagValue(cmd, "cert"), flagValue(cmd, "key")
	if cacert != "" || cert != "" || key != "" {
		if u.Scheme != "https" {
			return nil, badInput("--cacert, --cert and --key need an https:// --api-server (got %s)", base)
		}
		if tr.TLSClientConfig, err = clientTLS(cacert, cert, key); err != nil {
			return nil, err
		}
	}
	c := &apiClient{base: strings.TrimRight(base, "/"), http: &http.Client{Timeout: 60 * time.Second, Transport: tr}}
	if tf := flagValue(cmd, "token-file"); tf != "" {
		c.token, err = readToken(tf)
		if err != nil {
			return nil, badInput("--token-file: %v", err)
		}
	}
	return c, nil
}

// clientTLS builds the client's TLS settings from --cacert (the CA bundle
// the server's certificate must chain to; the system pool when empty) and
// --cert/--key (a client certificate for mTLS; both or neither).
func clientTLS(cacert, cert, key string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert != "" {
		b, err := os.ReadFile(cacert)
		if err != nil {
			return nil, badInput("--cacert: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, badInput("--cacert %s: no PEM certificate in it", cacert)
		}
		cfg.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, badInput("--cert and --key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, badInput("--cert/--key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// readToken reads a token file: the token alone, or the server's
// "<name> <role> <token>" line; it must be as private as the server's.
func readToken(path string) (string, error) {
	if _, err := apiauth.CheckSecretFile(path); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch len(f) {
		case 1:
			return f[0], nil
		case 3:
			return f[2], nil
		}
		return "", fmt.Errorf("%s: want the token alone or '<name> <role> <token>'", path)
	}
	return "", fmt.Errorf("%s holds no token", path)
}

// explainTransport turns a TLS failure into what to do about it.
func explainTransport(base string, err error) error {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &unknown), errors.As(err, &verify) && errors.As(verify.Err, &unknown):
		return fmt.Errorf("the kvgate API at %s presents a certificate kvctl does not trust; pass the CA that signed it with --cacert: %w", base, err)
	case errors.As(err, &host):
		return fmt.Errorf("the kvgate API's certificate is not valid for %s; use the name or address it was issued for in --api-server: %w", base, err)
	case strings.Contains(err.Error(), "certificate required"), strings.Contains(err.Error(), "bad certificate"):
		return fmt.Errorf("the kvgate API at %s requires a client certificate; pass one with --cert and --key: %w", base, err)
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("the kvgate API at %s speaks plain HTTP; use an http:// --api-server: %w", base, err)
	}
	return fmt.Errorf("cannot reach the kvgate API at %s (is kvgate running? see --api-server): %w", base, err)
}

// authHint says what to do about a 401 or 403.
func authHint(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return " (give a valid token with --token-file or KVCTL_TOKEN_FILE)"
	case http.StatusForbidden:
		return " (this token's role may only read; use an admin token)"
	}
	return ""
}
