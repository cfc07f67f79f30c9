package health

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// httpsEngine is a real loopback engine speaking https only with a
// certificate ca signed for 127.0.0.1; it counts TLS handshakes.
func httpsEngine(t *testing.T, ca *testcerts.CA, key string) (Target, *atomic.Int64) {
	t.Helper()
	pair, err := ca.Server("engine", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	var handshakes atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/metrics" {
			_, _ = w.Write([]byte(vllmMetrics))
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { handshakes.Add(1); return nil, nil }}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	srv.StartTLS()
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return Target{Ep: 0, Host: host, Port: p}, &handshakes
}

// TestProbeOverTLS: on a security-2 rule the http probe and the scrape
// speak https with the rule's engine client: a certificate the rule's CA
// signed passes (with the token, over one kept-alive connection); another
// CA's and a plain client fail with a reason that says what to fix.
func TestProbeOverTLS(t *testing.T) {
	ca, other, caFile := testcerts.EngineCAs(t)
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	good, handshakes := httpsEngine(t, ca, "sk-engine")
	stranger, _ := httpsEngine(t, other, "sk-engine")
	cases := []struct {
		name   string
		engine *engineclient.Client
		target Target
		words  string // "" = passes
	}{
		{"https, the rule's CA", engineclient.New(engineTLS), good, ""},
		{"https, another CA", engineclient.New(engineTLS), stranger, engineclient.HintUnknownCA},
		{"plain HTTP to an https engine", nil, good, "status 400"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, _, _ := newTestTracker(t, false, 0)
			p, err := NewProber(tr, ProbeConfig{Type: ProbeHTTP, Path: "/v1/models", Timeout: 5 * time.Second, Scrape: true,
				Token: staticToken{tok: "sk-engine"}, Engine: c.engine}, []Target{c.target}, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := handshakes.Load()
			for i := 0; i < 3; i++ {
				perr := p.Probe(context.Background(), c.target)
				serr := p.Scrape(context.Background(), c.target)
				if c.words == "" && (perr != nil || serr != nil) {
					t.Fatalf("probe %v, scrape %v", perr, serr)
				}
				if c.words != "" && (perr == nil || !strings.Contains(perr.Error(), c.words) || serr == nil || !strings.Contains(serr.Error(), c.words)) {
					t.Fatalf("want errors with %q, got probe %v, scrape %v", c.words, perr, serr)
				}
			}
			if c.words != "" {
				return
			}
			if b, ok := tr.GPUBlocks(0); !ok || b != 27354 {
				t.Fatalf("the https scrape did not land: %d %v", b, ok)
			}
			if n := handshakes.Load() - before; n != 1 {
				t.Fatalf("%d TLS handshakes for 6 calls; want 1 (a kept-alive connection)", n)
			}
		})
	}
}
