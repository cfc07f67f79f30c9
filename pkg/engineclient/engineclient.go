// Package engineclient builds the HTTP client kvgate uses for its own calls
// to a rule's engines: health probes, the /metrics scrape, the SGLang and
// TensorRT-LLM subscribers' HTTP calls and preflight. On a security-2 rule
// the engines speak https, so these calls do too, with the rule's engine TLS
// (tlsterm.EngineTLS: the same CA file, verification, server name and TLS
// versions as the data-plane dialer); on the other rules they are plain HTTP
// as before. docs/security.md, "kvgate's own calls to the engines".
//
// One Client per rule: its transport keeps at most one idle connection per
// engine, closed after IdleTimeout, so a probe every few seconds reuses its
// TLS connection instead of paying a handshake each time.
package engineclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// Bounds of the transport; each request is further bounded by the timeout
// its caller gives HTTP.
const (
	// DialTimeout bounds the TCP connect and the TLS handshake together.
	DialTimeout = 5 * time.Second
	// IdleTimeout closes an idle connection below uvicorn's 5 s keep-alive
	// (vLLM's server), so kvgate does not reuse a connection the engine is
	// about to close.
	IdleTimeout = 4 * time.Second
	// MaxIdlePerEngine and MaxIdle size the keep-alive pool small: these
	// calls are periodic and one at a time per engine and kind.
	MaxIdlePerEngine = 1
	MaxIdle          = 64
	// DefaultTimeout bounds a request whose caller gave no timeout.
	DefaultTimeout = 5 * time.Second
)

// Client is one rule's engine-facing HTTP transport. Safe for concurrent use.
type Client struct {
	engineTLS *tlsterm.EngineTLS // nil: plain HTTP
	tr        *http.Transport
}

// New returns the client for a rule: https with engineTLS (a security-2
// rule's), or plain HTTP when engineTLS is nil.
func New(engineTLS *tlsterm.EngineTLS) *Client {
	d := &net.Dialer{Timeout: DialTimeout}
	tr := &http.Transport{
		Proxy:               nil, // the engines are reached directly, whatever the environment says
		DialContext:         d.DialContext,
		MaxIdleConns:        MaxIdle,
		MaxIdleConnsPerHost: MaxIdlePerEngine,
		IdleConnTimeout:     IdleTimeout,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	if engineTLS != nil {
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, DialTimeout)
			defer cancel()
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return engineTLS.Client(ctx, nc, addr)
		}
	}
	return &Client{engineTLS: engineTLS, tr: tr}
}

// TLS reports whether the engines are called over https.
func (c *Client) TLS() bool { return c.engineTLS != nil }

// Scheme is "https" or "http".
func (c *Client) Scheme() string {
	if c.TLS() {
		return "https"
	}
	return "http"
}

// URL is the address of path on the engine at host:port.
func (c *Client) URL(host string, port int, path string) string {
	return c.Scheme() + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + path
}

// HTTP is an http.Client over the rule's transport whose requests take at
// most timeout in all (DefaultTimeout when not positive: every call to an
// engine is bounded). Redirects are not followed: an engine's answer is
// judged as it is.
func (c *Client) HTTP(timeout time.Duration) *http.Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &http.Client{Transport: c.tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// CloseIdle closes the idle connections (the rule is going away, or its
// prober restarts).
func (c *Client) CloseIdle() { c.tr.CloseIdleConnections() }

// Hints appended to a TLS failure, naming what to fix.
const (
	HintUnknownCA   = "the engine's certificate is not signed by a CA in mtls_backend.backend_ca_path (or the system's roots when it is empty)"
	HintHostname    = "the engine's certificate does not name the endpoint's address (an IP endpoint needs an IP SAN)"
	HintInvalidCert = "the engine's certificate is not valid (expired, not yet valid, or not for server authentication)"
	HintPlainEngine = "the engine answered in plain HTTP: it does not speak TLS (security 2 needs https engines)"
)

// Explain wraps err from a call to an engine with a hint when it is a TLS
// verification failure, so the log, the status page and preflight say what
// to fix; other errors are returned as they are.
func Explain(err error) error {
	if h := Hint(err); h != "" {
		return fmt.Errorf("%w (%s)", err, h)
	}
	return err
}

// Hint names what to fix when err is a TLS failure towards an engine; ""
// for any other error.
func Hint(err error) string {
	if err == nil {
		return ""
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		verify    *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &unknownCA):
		return HintUnknownCA
	case errors.As(err, &hostname):
		return HintHostname
	case errors.As(err, &invalid):
		return HintInvalidCert
	case errors.As(err, &record):
		return HintPlainEngine
	case errors.As(err, &verify):
		return "the engine's certificate did not verify"
	}
	return ""
}
