package preflight

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// tlsSource answers the TLS half of Source; the rest is not called here.
type tlsSource struct {
	Source
	engine *engineclient.Client
	vip    *tls.Config
	vipErr error
}

func (s tlsSource) EngineClient(int) *engineclient.Client { return s.engine }
func (s tlsSource) VIPClientTLS(int) (*tls.Config, error) { return s.vip, s.vipErr }

// httpsEngine serves /health, /v1/models and /metrics over https with a
// certificate ca signed for 127.0.0.1.
func httpsEngine(t *testing.T, ca *testcerts.CA) config.Endpoint {
	t.Helper()
	pair, err := ca.Server("engine", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"data":[{"id":"m","parent":null}]}`)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, warmMetrics) })
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "https://"))
	p, _ := strconv.Atoi(port)
	return config.Endpoint{Idx: 0, IP: host, TargetPort: p}
}

// TestEngineCallsOverTLS: on a security-2 rule the health and metrics rows
// call the engines over https with the rule's engine client; a certificate
// another CA signed fails the health row with the fix in its detail.
func TestEngineCallsOverTLS(t *testing.T) {
	ca, other, caFile := testcerts.EngineCAs(t)
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	rule := kvRule("sha256_cbor", 16)
	rule.Args.Security = config.SecurityE2EHTTPS
	cases := []struct {
		name   string
		ep     config.Endpoint
		result string
		words  string
	}{
		{"the rule's CA", httpsEngine(t, ca), Pass, "serves m"},
		{"another CA", httpsEngine(t, other), Fail, engineclient.HintUnknownCA},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := New(tlsSource{engine: engineclient.New(engineTLS), vip: &tls.Config{}}).forRule(rule)
			f := &endpointFacts{ep: c.ep}
			h := run.checkHealth(context.Background(), f)
			if h.Result != c.result || !strings.Contains(h.Detail, c.words) {
				t.Fatalf("health: %+v, want %s with %q", h, c.result, c.words)
			}
			if c.result == Fail && (!strings.Contains(h.Detail, "https://") || h.Fix != fixTLS) {
				t.Fatalf("the failed row does not name the https address and the TLS fix: %+v", h)
			}
			if c.result == Pass {
				if m := run.checkMetrics(context.Background(), rule, f); m.Result != Pass {
					t.Fatalf("metrics over https: %+v", m)
				}
			}
		})
	}
}

// TestVIPProbeScheme: the probe requests go to https://<vip> on TLS rules,
// with the rule's pin; a rule whose pin cannot be built fails the probe
// row with the reason instead of probing unverified.
func TestVIPProbeScheme(t *testing.T) {
	pin := &tls.Config{ServerName: "pinned"}
	cases := []struct {
		name     string
		security int
		src      tlsSource
		scheme   string
		err      string
	}{
		{"plain", config.SecurityPlain, tlsSource{}, "http", ""},
		{"https", config.SecurityHTTPS, tlsSource{vip: pin}, "https", ""},
		{"e2ehttps", config.SecurityE2EHTTPS, tlsSource{vip: pin}, "https", ""},
		{"no terminator", config.SecurityHTTPS, tlsSource{}, "https", "not running"},
		{"source error", config.SecurityHTTPS, tlsSource{vipErr: errors.New("service 1 is not running")}, "https", "service 1 is not running"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rule := kvRule("sha256_cbor", 16)
			rule.Args.Security = c.security
			run := New(c.src).forRule(rule)
			if run.vipScheme != c.scheme {
				t.Fatalf("scheme %s, want %s", run.vipScheme, c.scheme)
			}
			if c.err == "" {
				if run.vipErr != nil {
					t.Fatal(run.vipErr)
				}
				tr := run.probeClient.Transport.(*http.Transport)
				if c.src.vip != nil && tr.TLSClientConfig != pin {
					t.Fatal("the probe client does not carry the rule's pin")
				}
				return
			}
			if run.vipErr == nil || !strings.Contains(run.vipErr.Error(), c.err) {
				t.Fatalf("vipErr %v, want %q", run.vipErr, c.err)
			}
		})
	}
}
