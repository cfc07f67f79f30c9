package apiauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// TLSOptions configure a TLS listener's certificates.
type TLSOptions struct {
	CertFile, KeyFile string
	// ClientCAFile, when set, requires and verifies client certificates (mTLS).
	ClientCAFile   string
	ReloadInterval time.Duration
	Observer       Observer
	Log            *slog.Logger
}

// maxPEMBytes bounds a certificate, key or CA file.
const maxPEMBytes = 1 << 20

// TLS serves certificates that reload when their files change: new
// handshakes get the new certificate, established connections keep theirs,
// so a rotation drops nothing.
type TLS struct {
	opts TLSOptions
	cert *watched[*tls.Certificate]
	ca   *watched[*x509.CertPool]
}

// NewTLS loads the certificate, key and (optional) client CA. The key file
// must pass CheckSecretFile.
func NewTLS(opts TLSOptions) (*TLS, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.ReloadInterval <= 0 {
		opts.ReloadInterval = DefaultReloadInterval
	}
	t := &TLS{opts: opts}
	var err error
	t.cert, err = newWatched("certificate", []string{opts.CertFile, opts.KeyFile}, func() (*tls.Certificate, error) {
		if _, err := CheckSecretFile(opts.KeyFile); err != nil {
			return nil, fmt.Errorf("TLS key: %w", err)
		}
		certPEM, err := readBounded(opts.CertFile, maxPEMBytes)
		if err != nil {
			return nil, fmt.Errorf("TLS certificate %s: %w", opts.CertFile, err)
		}
		keyPEM, err := readBounded(opts.KeyFile, maxPEMBytes)
		if err != nil {
			return nil, fmt.Errorf("TLS key %s: %w", opts.KeyFile, err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("TLS certificate %s with key %s: %w", opts.CertFile, opts.KeyFile, err)
		}
		return &c, nil
	}, opts.Observer, opts.Log)
	if err != nil {
		return nil, err
	}
	if opts.ClientCAFile != "" {
		t.ca, err = newWatched("client-ca", []string{opts.ClientCAFile}, func() (*x509.CertPool, error) {
			b, err := readBounded(opts.ClientCAFile, maxPEMBytes)
			if err != nil {
				return nil, fmt.Errorf("client CA %s: %w", opts.ClientCAFile, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("client CA %s: no PEM certificate in it", opts.ClientCAFile)
			}
			return pool, nil
		}, opts.Observer, opts.Log)
		if err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Config is the server's TLS configuration: TLS 1.2 or newer, HTTP/1.1, the
// certificate in force at each handshake, and client certificates verified
// against the CA in force when mTLS is on.
func (t *TLS) Config() *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return t.cert.get(), nil
		},
	}
	if t.ca == nil {
		return base
	}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.ClientCAs = t.ca.get()
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = t.ca.get()
		c.GetConfigForClient = nil
		return c, nil
	}
	return base
}

// Run follows the files until ctx ends.
func (t *TLS) Run(ctx context.Context) {
	tick := time.NewTicker(t.opts.ReloadInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.Reload()
		}
	}
}

// Reload checks the files now.
func (t *TLS) Reload() {
	t.cert.check()
	if t.ca != nil {
		t.ca.check()
	}
}

// Certificate is the certificate pair in force, for servers that build their
// own tls.Config around these reloading files (package tlsterm).
func (t *TLS) Certificate() *tls.Certificate { return t.cert.get() }

// ClientCAs is the client CA pool in force; nil without ClientCAFile.
func (t *TLS) ClientCAs() *x509.CertPool {
	if t.ca == nil {
		return nil
	}
	return t.ca.get()
}
