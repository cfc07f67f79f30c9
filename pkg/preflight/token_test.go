package preflight

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

// keyedEngine guards /v1 with one key and leaves /health and /metrics open,
// as vLLM with --api-key does, recording each path's Authorization.
func keyedEngine(t *testing.T, key string) (config.Endpoint, func(path string) string) {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Get("Authorization")
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/v1") && r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
			return
		}
		switch r.URL.Path {
		case "/v1/models":
			_, _ = w.Write([]byte(`{"data":[{"id":"m","parent":null}]}`))
		case "/metrics":
			_, _ = w.Write([]byte(warmMetrics))
		}
	}))
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	p, _ := strconv.Atoi(port)
	return config.Endpoint{IP: host, TargetPort: p}, func(path string) string {
		mu.Lock()
		defer mu.Unlock()
		return seen[path]
	}
}

// TestPreflightBackendToken: the preflight reads the rule's backendTokenFile
// and sends it on its engine calls; each way of getting it wrong is named.
func TestPreflightBackendToken(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path string
		result     string
		detail     string
	}{
		{"no backendTokenFile", "", Fail, "GET http://%s/v1/models: HTTP 401: engine requires a token (backendTokenFile)"},
		{"the engine's key", file("good", "sk-engine\n", 0o600), Pass, "serves m"},
		{"a stale key", file("stale", "sk-old\n", 0o600), Fail, "HTTP 401: engine refused the token of backendTokenFile"},
		{"a loose file", file("loose", "sk-engine\n", 0o644), Fail, "HTTP 401: engine requires a token (backendTokenFile); no token in force: backend token file: " + filepath.Join(dir, "loose") + " has mode 0644"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ep, seen := keyedEngine(t, "sk-engine")
			rule := kvRule("sha256_cbor", 16)
			rule.Args.BackendTokenFile = tc.path
			run := New(nil).forRule(rule)
			f := &endpointFacts{ep: ep}
			c := run.checkHealth(context.Background(), f)
			want := strings.Replace(tc.detail, "%s", net.JoinHostPort(ep.IP, strconv.Itoa(ep.TargetPort)), 1)
			if c.Result != tc.result || !strings.Contains(c.Detail, want) {
				t.Fatalf("got %+v, want %s with %q", c, tc.result, want)
			}
			if tc.result == Fail && !strings.Contains(c.Fix, "backendTokenFile") {
				t.Fatalf("the fix does not name backendTokenFile: %q", c.Fix)
			}
			if strings.Contains(c.Detail+c.Fix, "sk-") {
				t.Fatalf("a token reached the report: %+v", c)
			}
			if tc.result != Pass {
				return
			}
			if m := run.checkMetrics(context.Background(), rule, f); m.Result != Pass {
				t.Fatalf("metrics: %+v", m)
			}
			for _, path := range []string{"/health", "/v1/models", "/metrics"} {
				if got := seen(path); got != "Bearer sk-engine" {
					t.Fatalf("%s got Authorization %q", path, got)
				}
			}
		})
	}
}
