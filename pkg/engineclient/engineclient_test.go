package engineclient

import (
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

func TestURL(t *testing.T) {
	ca, _ := testcerts.NewCA("engines")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		client *Client
		host   string
		want   string
	}{
		{"plain", New(nil), "10.0.0.2", "http://10.0.0.2:8000/metrics"},
		{"https", New(engineTLS), "10.0.0.2", "https://10.0.0.2:8000/metrics"},
		{"https IPv6", New(engineTLS), "fd00::2", "https://[fd00::2]:8000/metrics"},
	}
	for _, c := range cases {
		if got := c.client.URL(c.host, 8000, "/metrics"); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	if New(nil).HTTP(0).Timeout != DefaultTimeout {
		t.Error("a client without a timeout is unbounded")
	}
}

// server is a loopback https (pair != nil) or plain engine.
func server(t *testing.T, pair *testcerts.Pair) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if pair == nil {
		srv.Start()
	} else {
		cert, err := pair.TLS()
		if err != nil {
			t.Fatal(err)
		}
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		srv.StartTLS()
	}
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(strings.TrimPrefix(srv.URL, "https://"), "http://")
}

// TestCallsAndExplain: real calls to engines over the rule's client, and
// the hint each TLS failure carries.
func TestCallsAndExplain(t *testing.T) {
	ca, other, caFile := testcerts.EngineCAs(t)
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	good, _ := ca.Server("engine", "127.0.0.1")
	wrongName, _ := ca.Server("engine", "127.0.0.2")
	stranger, _ := other.Server("engine", "127.0.0.1")
	cases := []struct {
		name   string
		client *Client
		addr   string
		hint   string // "" = the call succeeds
	}{
		{"https engine", New(engineTLS), server(t, good), ""},
		{"plain engine, plain rule", New(nil), server(t, nil), ""},
		{"another CA", New(engineTLS), server(t, stranger), HintUnknownCA},
		{"certificate for another address", New(engineTLS), server(t, wrongName), HintHostname},
		{"plain engine on a security-2 rule", New(engineTLS), server(t, nil), HintPlainEngine},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := c.client.HTTP(5 * time.Second).Get(c.client.Scheme() + "://" + c.addr + "/health")
			if c.hint == "" {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				return
			}
			if err == nil {
				resp.Body.Close()
				t.Fatal("the call succeeded")
			}
			if got := Explain(err); !strings.Contains(got.Error(), c.hint) || !errors.Is(got, err) {
				t.Fatalf("Explain(%v) = %v, want the hint %q and the cause wrapped", err, got, c.hint)
			}
		})
	}
	plain := errors.New("connection refused")
	if got := Explain(plain); got.Error() != plain.Error() || !errors.Is(got, plain) || Explain(nil) != nil {
		t.Fatal("Explain changed an error that is not about TLS")
	}
}
