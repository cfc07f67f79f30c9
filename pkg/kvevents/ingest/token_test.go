package ingest

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// httpsEngineCerts is an engine certificate for 127.0.0.1 and the rule's
// engine TLS trusting its CA.
func httpsEngineCerts(t *testing.T) (*tlsterm.EngineTLS, tls.Certificate) {
	t.Helper()
	ca, err := testcerts.NewCA("engines")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Server("engine", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := p.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return engineTLS, cert
}

type fixedToken string

func (f fixedToken) Token() (string, error) { return string(f), nil }

// TestTargetSendsToken: kvgate's HTTP calls to an engine (SGLang's
// /get_server_info, TensorRT-LLM's /server_info and drain) carry the
// rule's backend token, and none without one; with the rule's https client
// (security 2) they reach an https-only engine.
func TestTargetSendsToken(t *testing.T) {
	engineTLS, pair := httpsEngineCerts(t)
	for _, tc := range []struct {
		name   string
		engine Engine
		token  TokenSource
		paths  []string
		want   string
		https  bool
	}{
		{"sglang page size over https", EngineSGLang, fixedToken("sk-engine"), []string{"/get_server_info"}, "Bearer sk-engine", true},
		{"trtllm drain and server info over https", EngineTRTLLM, fixedToken("sk-engine"), []string{"/kv_cache_events", "/server_info"}, "Bearer sk-engine", true},
		{"sglang page size", EngineSGLang, fixedToken("sk-engine"), []string{"/get_server_info"}, "Bearer sk-engine", false},
		{"trtllm drain and server info", EngineTRTLLM, fixedToken("sk-engine"), []string{"/kv_cache_events", "/server_info"}, "Bearer sk-engine", false},
		{"no token", EngineTRTLLM, nil, []string{"/kv_cache_events"}, "", false},
		{"a rule without a file", EngineTRTLLM, fixedToken(""), []string{"/kv_cache_events"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			seen := map[string][]string{}
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen[r.URL.Path] = append(seen[r.URL.Path], r.Header.Get("Authorization"))
				mu.Unlock()
				switch r.URL.Path {
				case "/get_server_info":
					_, _ = w.Write([]byte(`{"page_size":16}`))
				case "/server_info":
					_, _ = w.Write([]byte(`{"tokens_per_block":16,"kv_cache_hash_algo":"v1_block_key"}`))
				case "/kv_cache_events":
					_, _ = w.Write([]byte("[]"))
				default:
					http.NotFound(w, r)
				}
			}))
			var client *engineclient.Client
			if tc.https {
				srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
				srv.StartTLS()
				client = engineclient.New(engineTLS)
			} else {
				srv.Start()
			}
			defer srv.Close()
			host, p, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(srv.URL, "https://"), "http://"))
			port, _ := strconv.Atoi(p)
			ix, _ := inventory.New(inventory.Options{})
			opts := testOptions(newRecorder())
			opts.PollMin, opts.PollMax = time.Millisecond, 2*time.Millisecond
			m := NewManager(opts)
			defer m.Close()
			target := Target{Service: 1, IP: host, Port: port, Ranks: 1, Engine: tc.engine, Inventory: ix,
				Granularity: NewExactGranularity(16), Token: tc.token, HTTP: client}
			if tc.engine == EngineSGLang {
				target.Port, target.HTTPPort = freePort(t, host), port
			}
			if err := m.Reconcile([]Target{target}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				all := true
				for _, path := range tc.paths {
					all = all && len(seen[path]) > 0
				}
				mu.Unlock()
				if all {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("calls seen: %v", seen)
				}
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, path := range tc.paths {
				for _, got := range seen[path] {
					if got != tc.want {
						t.Fatalf("%s got Authorization %q, want %q", path, got, tc.want)
					}
				}
			}
		})
	}
}
