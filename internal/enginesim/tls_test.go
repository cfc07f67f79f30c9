package enginesim

import (
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/internal/testnet"
)

// TestSSLFlags: --ssl-certfile/--ssl-keyfile make the HTTP port https only
// (as vLLM's flags do); one without the other, or files that do not load,
// are refused at start.
func TestSSLFlags(t *testing.T) {
	ca, err := testcerts.NewCA("engines")
	if err != nil {
		t.Fatal(err)
	}
	host := testnet.Host(t)
	pair, err := ca.Server("engine", host)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := pair.Write(dir); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")

	e := startEngine(t, Config{Host: host, SSLCertFile: certFile, SSLKeyFile: keyFile, KVEventsEndpoint: "none", ReplayEndpoint: "none"})
	if !strings.HasPrefix(e.URL(), "https://") {
		t.Fatalf("URL %s", e.URL())
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	resp, err := c.Get(e.URL() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("https /health: %d", resp.StatusCode)
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get("http://" + strings.TrimPrefix(e.URL(), "https://") + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("the https-only port answered plain HTTP with 200")
		}
	}

	for _, c := range []struct {
		name, cert, key, words string
	}{
		{"cert without key", certFile, "", "go together"},
		{"key without cert", "", keyFile, "go together"},
		{"missing files", filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key"), "ssl-certfile/ssl-keyfile"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(Config{Host: host, SSLCertFile: c.cert, SSLKeyFile: c.key, KVEventsEndpoint: "none", ReplayEndpoint: "none", Logger: quietLogger()})
			if err == nil || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("want an error with %q, got %v", c.words, err)
			}
		})
	}
}
