// Package tlsterm terminates TLS for one rule's clients: the certificate
// pair under --tls-cert-dir (<dir>/<vip>_<port>/tls.crt and tls.key, plus
// one sub-directory per extra SNI name), reloaded when the files change
// without touching established connections, TLS 1.2/1.3 with ALPN http/1.1
// only, client certificates per the rule's mtls_frontend, and a bounded
// handshake whose failures are classified and counted. docs/security.md,
// "TLS termination on the data plane", is the operator's view.
//
// The file reload is package apiauth's (the management API's TLS): polling
// size, mtime and inode, so Kubernetes Secret symlink swaps are followed,
// and a pair that does not match (a half-done rotation) leaves the previous
// one in force.
package tlsterm

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/apiauth"
)

// File names inside a rule's certificate directory.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// Bounds.
const (
	// DefaultHandshakeTimeout bounds a client's handshake, so a slow or
	// silent client holds its connection slot for at most this long.
	DefaultHandshakeTimeout = 10 * time.Second
	// MaxSNINames bounds the SNI sub-directories one rule loads.
	MaxSNINames = 64
)

// Client-certificate modes (LoxiLB's mtls_frontend.client_cert_mode).
const (
	ClientCertDisabled = "disabled"
	ClientCertOptional = "optional"
	ClientCertRequired = "required"
)

// Observer counts what happens to a rule's TLS (pkg/metrics in the daemon).
type Observer interface {
	HandshakeFailed(reason string)
	Reload(ok bool)
}

type nopObserver struct{}

func (nopObserver) HandshakeFailed(string) {}
func (nopObserver) Reload(bool)            {}

// Options configure a Terminator.
type Options struct {
	// Dir is the rule's certificate directory, <--tls-cert-dir>/<vip>_<port>.
	Dir string
	// ClientCertMode is disabled (or empty), optional or required.
	ClientCertMode string
	// ClientCAFile signs accepted client certificates (optional and required modes).
	ClientCAFile     string
	ReloadInterval   time.Duration // 0: apiauth.DefaultReloadInterval
	HandshakeTimeout time.Duration // 0: DefaultHandshakeTimeout
	Observer         Observer
	Log              *slog.Logger
}

// Terminator holds one rule's certificates and TLS configuration.
type Terminator struct {
	opts Options
	def  *apiauth.TLS
	cfg  *tls.Config

	mu  sync.RWMutex
	sni map[string]*apiauth.TLS // lower-case SNI name (or *.domain) → its pair
}

// reloadObserver adapts apiauth's observer to ours.
type reloadObserver struct{ o Observer }

func (r reloadObserver) AuthFailure(string)       {}
func (r reloadObserver) Reload(_ string, ok bool) { r.o.Reload(ok) }

// MissingFiles names the files a rule's certificate directory lacks (nil
// when both are there), so a rule can be refused with the exact paths.
func MissingFiles(dir string) []string {
	var missing []string
	for _, f := range []string{CertFile, KeyFile} {
		p := filepath.Join(dir, f)
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			missing = append(missing, p)
		}
	}
	return missing
}

// New loads the rule's certificates. An error names the files at fault.
func New(opts Options) (*Terminator, error) {
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.ReloadInterval <= 0 {
		opts.ReloadInterval = apiauth.DefaultReloadInterval
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if m := MissingFiles(opts.Dir); len(m) > 0 {
		return nil, fmt.Errorf("missing %s", strings.Join(m, " and "))
	}
	var auth tls.ClientAuthType
	switch opts.ClientCertMode {
	case "", ClientCertDisabled:
		opts.ClientCAFile = ""
	case ClientCertOptional:
		auth = tls.VerifyClientCertIfGiven
	case ClientCertRequired:
		auth = tls.RequireAndVerifyClientCert
	default:
		return nil, fmt.Errorf("client certificate mode %q: want disabled, optional or required", opts.ClientCertMode)
	}
	if auth != tls.NoClientCert && opts.ClientCAFile == "" {
		return nil, errors.New("client certificates need a client CA file")
	}
	def, err := apiauth.NewTLS(apiauth.TLSOptions{CertFile: filepath.Join(opts.Dir, CertFile), KeyFile: filepath.Join(opts.Dir, KeyFile),
		ClientCAFile: opts.ClientCAFile, ReloadInterval: opts.ReloadInterval, Observer: reloadObserver{opts.Observer}, Log: opts.Log})
	if err != nil {
		return nil, err
	}
	t := &Terminator{opts: opts, def: def, sni: map[string]*apiauth.TLS{}}
	t.scanSNI()
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"http/1.1"},
		GetCertificate: t.certificate,
		ClientAuth:     auth,
	}
	if auth != tls.NoClientCert {
		// The CA in force at each handshake, so a CA rotation needs no restart.
		base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			c.ClientCAs = def.ClientCAs()
			c.GetConfigForClient = nil
			return c, nil
		}
	}
	t.cfg = base
	return t, nil
}

// Config is the server configuration; its certificate follows the files.
func (t *Terminator) Config() *tls.Config { return t.cfg }

// certificate picks the pair for the client's SNI name: an exact
// sub-directory, then a wildcard one (*.parent), then the rule's own pair.
func (t *Terminator) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	if name != "" {
		t.mu.RLock()
		p, ok := t.sni[name]
		if !ok {
			if i := strings.IndexByte(name, '.'); i > 0 {
				p, ok = t.sni["*"+name[i:]]
			}
		}
		t.mu.RUnlock()
		if ok {
			return p.Certificate(), nil
		}
	}
	return t.def.Certificate(), nil
}

// SNINames lists the extra names served, sorted.
func (t *Terminator) SNINames() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]string, 0, len(t.sni))
	for n := range t.sni {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// scanSNI follows the SNI sub-directories: new ones are loaded, removed ones
// dropped, existing ones reloaded when their files changed.
func (t *Terminator) scanSNI() {
	entries, err := os.ReadDir(t.opts.Dir)
	if err != nil {
		t.opts.Log.Warn("reading the TLS certificate directory", "dir", t.opts.Dir, "err", err)
		return
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() && e.Type()&os.ModeSymlink == 0 || strings.HasPrefix(e.Name(), ".") {
			continue // Kubernetes' ..data and ..<timestamp> directories are not names
		}
		name := strings.ToLower(e.Name())
		if len(seen) >= MaxSNINames {
			t.opts.Log.Warn("too many SNI directories; the rest are ignored", "dir", t.opts.Dir, "max", MaxSNINames)
			break
		}
		dir := filepath.Join(t.opts.Dir, e.Name())
		if len(MissingFiles(dir)) > 0 {
			continue
		}
		seen[name] = true
		t.mu.RLock()
		cur := t.sni[name]
		t.mu.RUnlock()
		if cur != nil {
			cur.Reload()
			continue
		}
		p, err := apiauth.NewTLS(apiauth.TLSOptions{CertFile: filepath.Join(dir, CertFile), KeyFile: filepath.Join(dir, KeyFile),
			ReloadInterval: t.opts.ReloadInterval, Observer: reloadObserver{t.opts.Observer}, Log: t.opts.Log})
		if err != nil {
			t.opts.Observer.Reload(false)
			t.opts.Log.Error("SNI certificate not loaded", "name", name, "err", err)
			continue
		}
		t.mu.Lock()
		t.sni[name] = p
		t.mu.Unlock()
		t.opts.Log.Info("SNI certificate loaded", "name", name, "dir", dir)
	}
	t.mu.Lock()
	for n := range t.sni {
		if !seen[n] {
			delete(t.sni, n)
			t.opts.Log.Info("SNI certificate removed", "name", n)
		}
	}
	t.mu.Unlock()
}

// Reload checks every file now.
func (t *Terminator) Reload() {
	t.def.Reload()
	t.scanSNI()
}

// Run follows the files until ctx ends.
func (t *Terminator) Run(ctx context.Context) {
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

// Wrap returns the server side of an accepted connection; no I/O happens
// until Handshake.
func (t *Terminator) Wrap(nc net.Conn) *tls.Conn { return tls.Server(nc, t.cfg) }

// ErrPlainHTTP is in a Handshake error when the client spoke plain HTTP to
// the TLS port; the error also holds the tls.RecordHeaderError whose Conn
// the caller may answer on (the proxy sends a 400, as Go's own HTTPS server
// does) before it closes the connection.
var ErrPlainHTTP = errors.New("plain HTTP on a TLS port")

// Handshake completes tc's handshake within the handshake timeout (and
// ctx). On failure the reason is counted and logged at debug level, and the
// caller closes the connection (answering a plain-HTTP client first; see
// ErrPlainHTTP).
func (t *Terminator) Handshake(ctx context.Context, tc *tls.Conn) error {
	hctx, cancel := context.WithTimeout(ctx, t.opts.HandshakeTimeout)
	defer cancel()
	err := tc.HandshakeContext(hctx)
	if err == nil {
		return nil
	}
	reason := Reason(err)
	if reason == "timeout" && hctx.Err() == nil && ctx.Err() != nil {
		reason = "eof" // the server is shutting down: not the client's fault
	}
	t.opts.Observer.HandshakeFailed(reason)
	t.opts.Log.Debug("TLS handshake failed", "remote", tc.RemoteAddr().String(), "reason", reason, "err", err)
	if reason == "plain_http" {
		return fmt.Errorf("TLS handshake (%s): %w: %w", reason, ErrPlainHTTP, err)
	}
	return fmt.Errorf("TLS handshake (%s): %w", reason, err)
}
