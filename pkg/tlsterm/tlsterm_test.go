package tlsterm

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
)

type countObserver struct {
	mu      sync.Mutex
	reasons map[string]int
	reloads map[bool]int
}

func newCountObserver() *countObserver {
	return &countObserver{reasons: map[string]int{}, reloads: map[bool]int{}}
}

func (o *countObserver) HandshakeFailed(r string) { o.mu.Lock(); o.reasons[r]++; o.mu.Unlock() }
func (o *countObserver) Reload(ok bool)           { o.mu.Lock(); o.reloads[ok]++; o.mu.Unlock() }
func (o *countObserver) count(r string) int       { o.mu.Lock(); defer o.mu.Unlock(); return o.reasons[r] }

type fixture struct {
	ca  *testcerts.CA
	dir string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ca, err := testcerts.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ca: ca, dir: filepath.Join(t.TempDir(), "127.0.0.1_8443")}
	f.writePair(t, f.dir, "default", "127.0.0.1")
	return f
}

func (f *fixture) writePair(t *testing.T, dir, cn string, names ...string) {
	t.Helper()
	p, err := f.ca.Server(cn, names...)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(dir); err != nil {
		t.Fatal(err)
	}
}

// serve accepts on loopback and runs every connection through term's
// handshake; each successful one answers "ok\n" and closes.
func serve(t *testing.T, term *Terminator) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				tc := term.Wrap(nc)
				if err := term.Handshake(context.Background(), tc); err != nil {
					// The raw connection is the caller's to answer on.
					var re tls.RecordHeaderError
					if errors.Is(err, ErrPlainHTTP) && errors.As(err, &re) && re.Conn != nil {
						_, _ = io.WriteString(re.Conn, "plain HTTP seen\n")
					}
					return
				}
				_, _ = io.WriteString(tc, "ok\n")
				_ = tc.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// dial handshakes as a client and returns the server certificate's CN.
func dial(addr string, cfg *tls.Config) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	if string(b) != "ok\n" {
		return "", errors.New("unexpected answer " + string(b))
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// TestSNI: an SNI name with its own sub-directory gets that certificate (a
// wildcard directory covers one label), any other name or none the rule's.
func TestSNI(t *testing.T) {
	f := newFixture(t)
	f.writePair(t, filepath.Join(f.dir, "api.example.com"), "api", "api.example.com")
	f.writePair(t, filepath.Join(f.dir, "*.wild.example"), "wild", "*.wild.example")
	term, err := New(Options{Dir: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, term)
	cases := []struct{ sni, cn string }{
		{"", "default"},
		{"api.example.com", "api"},
		{"API.Example.com", "api"},
		{"x.wild.example", "wild"},
		{"other.example.com", "default"},
	}
	for _, c := range cases {
		t.Run(c.sni, func(t *testing.T) {
			cfg := &tls.Config{RootCAs: f.ca.Pool(), ServerName: c.sni, InsecureSkipVerify: c.cn == "default" && c.sni != ""}
			if c.sni == "" {
				cfg.ServerName = "127.0.0.1"
			}
			cn, err := dial(addr, cfg)
			if err != nil || cn != c.cn {
				t.Fatalf("SNI %q: got certificate %q (%v), want %q", c.sni, cn, err, c.cn)
			}
		})
	}
	if got := strings.Join(term.SNINames(), ","); got != "*.wild.example,api.example.com" {
		t.Fatalf("SNI names %s", got)
	}
	// A removed directory stops being served.
	if err := os.RemoveAll(filepath.Join(f.dir, "api.example.com")); err != nil {
		t.Fatal(err)
	}
	term.Reload()
	if got := strings.Join(term.SNINames(), ","); got != "*.wild.example" {
		t.Fatalf("after removal: SNI names %s", got)
	}
}

// TestReload: a rotated pair is served to new handshakes; a half-written
// rotation (certificate without its key) keeps the old pair in force.
func TestReload(t *testing.T) {
	f := newFixture(t)
	obs := newCountObserver()
	term, err := New(Options{Dir: f.dir, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, term)
	cfg := &tls.Config{RootCAs: f.ca.Pool(), ServerName: "127.0.0.1"}
	if cn, err := dial(addr, cfg); err != nil || cn != "default" {
		t.Fatalf("before: %q %v", cn, err)
	}
	// Half a rotation: a new certificate next to the old key.
	p, err := f.ca.Server("rotated", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, CertFile), p.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	term.Reload()
	if cn, err := dial(addr, cfg); err != nil || cn != "default" {
		t.Fatalf("mid-rotation: %q %v (want the old pair)", cn, err)
	}
	if err := p.Write(f.dir); err != nil {
		t.Fatal(err)
	}
	term.Reload()
	if cn, err := dial(addr, cfg); err != nil || cn != "rotated" {
		t.Fatalf("after: %q %v", cn, err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.reloads[false] != 1 || obs.reloads[true] != 1 {
		t.Fatalf("reloads %v, want one refused and one ok", obs.reloads)
	}
}

// TestClientCertModes: LoxiLB's client_cert_mode values.
func TestClientCertModes(t *testing.T) {
	f := newFixture(t)
	caFile := filepath.Join(t.TempDir(), "clients.crt")
	if err := f.ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	good, err := f.ca.Client("good client")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.NewCA("other CA")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := other.Client("stranger")
	if err != nil {
		t.Fatal(err)
	}
	goodCert, _ := good.TLS()
	badCert, _ := bad.TLS()
	cases := []struct {
		mode   string
		client *tls.Certificate
		ok     bool
	}{
		{ClientCertDisabled, nil, true},
		{ClientCertOptional, nil, true},
		{ClientCertOptional, &goodCert, true},
		{ClientCertOptional, &badCert, false},
		{ClientCertRequired, nil, false},
		{ClientCertRequired, &goodCert, true},
		{ClientCertRequired, &badCert, false},
	}
	for _, c := range cases {
		name := c.mode + "/none"
		if c.client != nil {
			name = c.mode + "/" + c.client.Leaf.Subject.CommonName
		}
		t.Run(name, func(t *testing.T) {
			obs := newCountObserver()
			term, err := New(Options{Dir: f.dir, ClientCertMode: c.mode, ClientCAFile: caFile, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			addr := serve(t, term)
			cfg := &tls.Config{RootCAs: f.ca.Pool(), ServerName: "127.0.0.1"}
			if c.client != nil {
				// Sent whatever CAs the server names (Go's client would
				// otherwise keep a certificate the server cannot accept).
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.client, nil }
			}
			_, err = dial(addr, cfg)
			if c.ok != (err == nil) {
				t.Fatalf("ok %v, got %v", c.ok, err)
			}
			if !c.ok {
				deadline := time.Now().Add(5 * time.Second)
				for obs.count("client_cert") != 1 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if n := obs.count("client_cert"); n != 1 {
					t.Fatalf("client_cert failures %d, want 1 (%v)", n, obs.reasons)
				}
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	f := newFixture(t)
	empty := t.TempDir()
	cases := []struct {
		name  string
		opts  Options
		words string
	}{
		{"no files", Options{Dir: empty}, filepath.Join(empty, CertFile) + " and " + filepath.Join(empty, KeyFile)},
		{"required without CA", Options{Dir: f.dir, ClientCertMode: ClientCertRequired}, "client CA"},
		{"bad mode", Options{Dir: f.dir, ClientCertMode: "require"}, "disabled, optional or required"},
		{"missing CA", Options{Dir: f.dir, ClientCertMode: ClientCertRequired, ClientCAFile: "/nonexistent/ca.crt"}, "/nonexistent/ca.crt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.opts)
			if err == nil || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("want an error naming %q, got %v", c.words, err)
			}
		})
	}
	// A world-readable key is refused, as for the management API.
	if err := os.Chmod(filepath.Join(f.dir, KeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Dir: f.dir}); err == nil || !strings.Contains(err.Error(), "mode 0644") {
		t.Fatalf("want the key's mode refused, got %v", err)
	}
}

// TestBadHandshakes: each kind of bad input is classified and counted, a
// plain HTTP request is reported as ErrPlainHTTP with the raw connection to
// answer on (the proxy's 400 is tested in tests/e2e), and a client
// handshaking meanwhile is served.
func TestBadHandshakes(t *testing.T) {
	f := newFixture(t)
	obs := newCountObserver()
	term, err := New(Options{Dir: f.dir, Observer: obs, HandshakeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, term)
	cases := []struct {
		name, reason string
		send         []byte
		answer       string // a prefix of what the client reads back
	}{
		{"silent client", "timeout", nil, ""},
		{"slow ClientHello", "timeout", []byte{0x16, 0x03, 0x01, 0x00, 0x80, 0x01}, ""},
		{"plain HTTP", "plain_http", []byte("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"), "plain HTTP seen"},
		{"plain HTTP POST", "plain_http", []byte("POST /v1/chat/completions HTTP/1.1\r\n\r\n"), "plain HTTP seen"},
		{"garbage", "bad_record", []byte("\x00\x01\x02\x03\x04\x05\x06\x07"), ""},
		{"oversize record", "oversize", []byte{0x16, 0x03, 0x01, 0xff, 0xff}, ""},
		{"oversize ClientHello", "oversize", []byte{0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x0f, 0xff, 0xff}, ""},
		{"hang up", "eof", []byte{0x16, 0x03, 0x01}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := obs.count(c.reason)
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if len(c.send) > 0 {
				if _, err := nc.Write(c.send); err != nil {
					t.Fatal(err)
				}
			}
			if c.reason == "eof" {
				_ = nc.Close()
			}
			// Meanwhile a good client is served.
			if cn, err := dial(addr, &tls.Config{RootCAs: f.ca.Pool(), ServerName: "127.0.0.1"}); err != nil || cn != "default" {
				t.Fatalf("a concurrent good client failed: %v", err)
			}
			if c.reason != "eof" {
				_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
				got, _ := io.ReadAll(nc)
				if !strings.HasPrefix(string(got), c.answer) {
					t.Fatalf("answer %q, want prefix %q", got, c.answer)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for obs.count(c.reason) == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if obs.count(c.reason) != before+1 {
				t.Fatalf("reason %s not counted: %v", c.reason, obs.reasons)
			}
		})
	}
}

// TestALPNAndVersions: TLS 1.2 and 1.3 are served, http/1.1 is the only
// protocol offered, and TLS 1.1 or an h2-only client is refused.
func TestALPNAndVersions(t *testing.T) {
	f := newFixture(t)
	term, err := New(Options{Dir: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, term)
	base := tls.Config{RootCAs: f.ca.Pool(), ServerName: "127.0.0.1"}
	cases := []struct {
		name      string
		edit      func(c *tls.Config)
		ok        bool
		wantProto string
	}{
		{"TLS 1.3", func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }, true, ""},
		{"TLS 1.2", func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }, true, ""},
		{"TLS 1.1", func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS11, tls.VersionTLS11 }, false, ""},
		{"h2 and http/1.1", func(c *tls.Config) { c.NextProtos = []string{"h2", "http/1.1"} }, true, "http/1.1"},
		{"h2 only", func(c *tls.Config) { c.NextProtos = []string{"h2"} }, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := base.Clone()
			c.edit(cfg)
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
			if c.ok != (err == nil) {
				t.Fatalf("ok %v, got %v", c.ok, err)
			}
			if err == nil {
				defer conn.Close()
				if p := conn.ConnectionState().NegotiatedProtocol; p != c.wantProto {
					t.Fatalf("ALPN %q, want %q", p, c.wantProto)
				}
			}
		})
	}
}
