package tlsterm

// The client side of a security-2 rule: how kvgate verifies its engines'
// certificates. The data-plane dialer (pkg/gateway) and kvgate's own HTTP
// calls to the engines (pkg/engineclient: probes, scrapes, subscribers,
// preflight) both take their tls.Config from here, so a request and a probe
// of one engine trust the same CA, check the same name and speak the same
// versions (docs/security.md, "Engines over TLS").

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// MaxCABytes bounds a backend CA bundle.
const MaxCABytes = 1 << 20

// caCheckEvery bounds how often the CA file is stat'ed (on the dial path).
const caCheckEvery = time.Second

// sessionCacheSize is the number of TLS sessions kept per rule for
// resumption (one per engine and then some).
const sessionCacheSize = 256

// EngineTLS is one rule's TLS towards its engines: the CA pool of
// mtls_backend.backend_ca_path (the system's roots when empty), re-read when
// the file changes, and a session cache so reconnections resume.
type EngineTLS struct {
	path  string
	cache tls.ClientSessionCache

	mu   sync.Mutex
	pool *x509.CertPool // nil: the system's roots
	seen time.Time      // mtime of the loaded file
	next time.Time      // earliest next stat
}

// NewEngineTLS loads caFile ("" for the system's roots). An error names the
// file and what is wrong with it.
func NewEngineTLS(caFile string) (*EngineTLS, error) {
	e := &EngineTLS{path: caFile, cache: tls.NewLRUClientSessionCache(sessionCacheSize)}
	if caFile == "" {
		return e, nil
	}
	pool, mtime, err := LoadCAFile(caFile)
	if err != nil {
		return nil, err
	}
	e.pool, e.seen = pool, mtime
	return e, nil
}

// LoadCAFile reads a PEM CA bundle of at most MaxCABytes.
func LoadCAFile(path string) (*x509.CertPool, time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxCABytes+1))
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > MaxCABytes {
		return nil, time.Time{}, fmt.Errorf("%s is larger than %d bytes", path, MaxCABytes)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, time.Time{}, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, fi.ModTime(), nil
}

// roots is the CA pool in force, re-read when the file's mtime changed. A
// version that does not load leaves the previous pool in force, so a
// half-written file fails no handshake.
func (e *EngineTLS) roots() *x509.CertPool {
	if e.path == "" {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if now.Before(e.next) {
		return e.pool
	}
	e.next = now.Add(caCheckEvery)
	fi, err := os.Stat(e.path)
	if err != nil || fi.ModTime().Equal(e.seen) {
		return e.pool
	}
	if pool, mtime, err := LoadCAFile(e.path); err == nil {
		e.pool, e.seen = pool, mtime
	}
	return e.pool
}

// ClientConfig is the configuration for one connection to the engine at
// addr (host:port): TLS 1.2+, ALPN http/1.1, the certificate verified for
// the host as written in the rule (an IP address needs an IP SAN).
func (e *EngineTLS) ClientConfig(addr string) *tls.Config {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, NextProtos: []string{"http/1.1"},
		ClientSessionCache: e.cache, RootCAs: e.roots()}
}

// Client runs the handshake on nc, an open connection to addr, bounded by
// ctx; on failure nc is closed and the error names addr.
func (e *EngineTLS) Client(ctx context.Context, nc net.Conn, addr string) (*tls.Conn, error) {
	tc := tls.Client(nc, e.ClientConfig(addr))
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("TLS to %s: %w", addr, err)
	}
	return tc, nil
}
