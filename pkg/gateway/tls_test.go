package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

func TestRuleLeg(t *testing.T) {
	cases := []struct {
		name             string
		security         int
		daemon           string
		wantPath, reason string
	}{
		{"plain follows --datapath", 0, "sockmap", "sockmap", legReasonDatapath},
		{"plain userspace", 0, "userspace", "userspace", legReasonDatapath},
		{"https copies in userspace", 1, "sockmap", "userspace", legReasonTLS},
		{"e2ehttps copies in userspace", 2, "sockmap", "userspace", legReasonTLS},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &config.Rule{Args: config.ServiceArguments{Security: c.security}}
			if p, why := ruleLeg(r, c.daemon); p != c.wantPath || why != c.reason {
				t.Fatalf("got %s/%s, want %s/%s", p, why, c.wantPath, c.reason)
			}
		})
	}
}

// tlsEngine is a TLS server answering one short HTTP response per
// connection, counting full and resumed handshakes.
type tlsEngine struct {
	addr           string
	full, resumed  atomic.Int64
	handshakeError atomic.Int64
}

func startTLSEngine(tb testing.TB, pair *testcerts.Pair) *tlsEngine {
	tb.Helper()
	cert, err := pair.TLS()
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	e := &tlsEngine{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() != nil {
					e.handshakeError.Add(1)
					return
				}
				if tc.ConnectionState().DidResume {
					e.resumed.Add(1)
				} else {
					e.full.Add(1)
				}
				_, _ = io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	return e
}

func engineCerts(tb testing.TB, dir string) (*testcerts.CA, *testcerts.Pair, string) {
	tb.Helper()
	ca, err := testcerts.NewCA("engines")
	if err != nil {
		tb.Fatal(err)
	}
	pair, err := ca.Server("engine", "127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	caFile := filepath.Join(dir, "engines.crt")
	if err := ca.WriteCA(caFile); err != nil {
		tb.Fatal(err)
	}
	return ca, pair, caFile
}

func dialOnce(tb testing.TB, dial func(ctx context.Context, addr string) (net.Conn, error), addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(c) // reading takes the session ticket
	return err
}

// TestBackendTLSDial: the security-2 dialer verifies the engine against the
// CA file, resumes sessions after the first connection, refuses a
// certificate the CA did not sign, and follows a replaced CA file.
func TestBackendTLSDial(t *testing.T) {
	dir := t.TempDir()
	_, pair, caFile := engineCerts(t, dir)
	eng := startTLSEngine(t, pair)
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	dial := newBackendTLSDialer(engineTLS, nil)
	for i := 0; i < 4; i++ {
		if err := dialOnce(t, dial, eng.addr); err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
	}
	if eng.full.Load() != 1 || eng.resumed.Load() != 3 {
		t.Fatalf("full %d, resumed %d handshakes; want 1 and 3", eng.full.Load(), eng.resumed.Load())
	}
	// An engine whose certificate another CA signed is refused.
	_, strangerPair, _ := engineCerts(t, t.TempDir())
	stranger := startTLSEngine(t, strangerPair)
	if err := dialOnce(t, dial, stranger.addr); err == nil {
		t.Fatal("an engine certificate from another CA was accepted")
	}
	// The CA file's reload is tlsterm's (TestEngineTLSFollowsCAFile).
}

// BenchmarkBackendTLSDial: what a request pays to open its engine
// connection, on loopback: plain TCP, TLS with a full handshake each time,
// and kvgate's security-2 dialer (sessions resumed from its cache).
func BenchmarkBackendTLSDial(b *testing.B) {
	dir := b.TempDir()
	ca, pair, caFile := engineCerts(b, dir)
	eng := startTLSEngine(b, pair)
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		b.Fatal(err)
	}
	plainLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { plainLn.Close() })
	go func() {
		for {
			c, err := plainLn.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			c.Close()
		}
	}()
	var d net.Dialer
	full := func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(nc, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		return tc, nil
	}
	cases := []struct {
		name string
		dial func(ctx context.Context, addr string) (net.Conn, error)
		addr string
	}{
		{"plain-tcp", func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }, plainLn.Addr().String()},
		{"tls-full-handshake", full, eng.addr},
		{"tls-resumed", newBackendTLSDialer(engineTLS, nil), eng.addr},
		// Not what kvgate does: how much of a handshake is the key exchange
		// (Go's default hybrid X25519MLKEM768 against X25519 alone).
		{"tls-full-handshake-x25519-only", x25519Dial(ca, false), eng.addr},
		{"tls-resumed-x25519-only", x25519Dial(ca, true), eng.addr},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := dialOnce(b, c.dial, c.addr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// x25519Dial is a TLS dialer restricted to the X25519 key exchange, with or
// without session resumption (benchmark only).
func x25519Dial(ca *testcerts.CA, resume bool) func(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", CurvePreferences: []tls.CurveID{tls.X25519}}
	if resume {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(16)
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		return tc, nil
	}
}

// TestRuleEngineTLS: only security-2 rules get an engine TLS (the other
// rules' own calls stay plain HTTP), and a CA file that cannot serve is a
// 400 naming mtls_backend.backend_ca_path.
func TestRuleEngineTLS(t *testing.T) {
	_, _, caFile := engineCerts(t, t.TempDir())
	missing := filepath.Join(t.TempDir(), "none.crt")
	cases := []struct {
		name     string
		security int
		caPath   string
		wantTLS  bool
		errField string
	}{
		{"plain", config.SecurityPlain, "", false, ""},
		{"https to clients only", config.SecurityHTTPS, "", false, ""},
		{"e2ehttps with a CA file", config.SecurityE2EHTTPS, caFile, true, ""},
		{"e2ehttps with the system's roots", config.SecurityE2EHTTPS, "", true, ""},
		{"e2ehttps with a missing CA file", config.SecurityE2EHTTPS, missing, false, "serviceArguments.mtls_backend.backend_ca_path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rule := &config.Rule{}
			rule.Args.Security = c.security
			if c.caPath != "" {
				rule.Args.MTLSBackend = &config.MTLSBackend{BackendCAPath: c.caPath}
			}
			e, err := ruleEngineTLS(rule)
			if c.errField != "" {
				var ve *config.ValidationError
				if !errors.As(err, &ve) || ve.Field != c.errField || !strings.Contains(ve.Msg, missing) {
					t.Fatalf("want a 400 on %s naming %s, got %v", c.errField, missing, err)
				}
				return
			}
			if err != nil || (e != nil) != c.wantTLS {
				t.Fatalf("engine TLS %v, err %v; want TLS %v", e, err, c.wantTLS)
			}
		})
	}
}

// TestBackendPoolOnlyE2EHTTPS: only security-2 rules get an engine
// connection pool (docs/security.md, "Engine connection pool"), with the
// daemon's bounds, and their connection series exist at 0 from the start.
func TestBackendPoolOnlyE2EHTTPS(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	g := &Gateway{Metrics: m, opts: Options{BackendPool: fullproxy.PoolOptions{MaxIdlePerEndpoint: 3}}}
	for security, want := range map[int]bool{0: false, 1: false, 2: true} {
		r := &config.Rule{ServiceID: 40 + security, Args: config.ServiceArguments{Security: security}}
		p := g.backendPool(r)
		if (p != nil) != want {
			t.Fatalf("security %d: pool %v, want one: %v", security, p, want)
		}
		if want && p.MaxIdlePerEndpoint != 3 {
			t.Fatalf("security %d: pool bounds %+v, want the daemon's", security, *p)
		}
	}
	if n := testutil.CollectAndCount(m.BackendConns, "kvgate_backend_connections_total"); n != len(metrics.BackendConnResults) {
		t.Fatalf("%d kvgate_backend_connections_total series, want %d (the security-2 rule's, at 0)", n, len(metrics.BackendConnResults))
	}
}
