package health

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

// keyedEngine is a real loopback server guarding every path with one key,
// as an engine behind an authenticating proxy does; it records the
// Authorization header of each request.
type keyedEngine struct {
	srv  *httptest.Server
	mu   sync.Mutex
	key  string
	seen map[string]string // path -> last Authorization header
}

func newKeyedEngine(t *testing.T, key string) *keyedEngine {
	t.Helper()
	e := &keyedEngine{key: key, seen: map[string]string{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen[r.URL.Path] = r.Header.Get("Authorization")
		ok := r.Header.Get("Authorization") == "Bearer "+e.key
		e.mu.Unlock()
		if !ok {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/metrics" {
			_, _ = w.Write([]byte(vllmMetrics))
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *keyedEngine) setKey(k string) { e.mu.Lock(); e.key = k; e.mu.Unlock() }

func (e *keyedEngine) header(path string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seen[path]
}

func (e *keyedEngine) target(ep int) Target {
	host, port, _ := net.SplitHostPort(e.srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return Target{Ep: ep, Host: host, Port: p}
}

// staticToken is a TokenSource with a fixed answer.
type staticToken struct {
	tok string
	err error
}

func (s staticToken) Token() (string, error) { return s.tok, s.err }

// TestProbeSendsBackendToken: the probe and the scrape carry the rule's
// token; a 401 names what to fix, with and without a token.
func TestProbeSendsBackendToken(t *testing.T) {
	eng := newKeyedEngine(t, "sk-engine")
	tests := []struct {
		name     string
		token    TokenSource
		pass     bool
		errWords string
	}{
		{"no token source", nil, false, "status 401: engine requires a token (backendTokenFile)"},
		{"no token in force", staticToken{err: errors.New("backend token file /k: has mode 0644")}, false,
			"status 401: engine requires a token (backendTokenFile); no token in force: backend token file /k: has mode 0644"},
		{"the right token", staticToken{tok: "sk-engine"}, true, ""},
		{"a stale token", staticToken{tok: "sk-old"}, false, "status 401: engine refused the token of backendTokenFile"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, _, _ := newTestTracker(t, false, 0)
			p, err := NewProber(tr, ProbeConfig{Type: "http", Path: "/v1/models", Timeout: 5 * time.Second, Scrape: true, Token: tc.token},
				[]Target{eng.target(0)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			perr := p.Probe(context.Background(), eng.target(0))
			serr := p.Scrape(context.Background(), eng.target(0))
			if tc.pass {
				if perr != nil || serr != nil {
					t.Fatalf("probe %v, scrape %v", perr, serr)
				}
				if b, ok := tr.GPUBlocks(0); !ok || b != 27354 {
					t.Fatalf("scrape with the token did not land: %d %v", b, ok)
				}
				for _, path := range []string{"/v1/models", "/metrics"} {
					if h := eng.header(path); h != "Bearer sk-engine" {
						t.Fatalf("%s got Authorization %q", path, h)
					}
				}
				return
			}
			if perr == nil || !strings.Contains(perr.Error(), tc.errWords) {
				t.Fatalf("probe err = %v, want %q", perr, tc.errWords)
			}
			if serr == nil || !strings.Contains(serr.Error(), tc.errWords) {
				t.Fatalf("scrape err = %v, want %q", serr, tc.errWords)
			}
			if strings.Contains(perr.Error(), "sk-") && !strings.Contains(tc.errWords, "sk-") {
				t.Fatalf("the error quotes a token: %v", perr)
			}
		})
	}
}

// TestProbeTokenRotationLogsOnce: an endpoint that fails the same way logs
// its reason once, goes down, and comes back once the key matches again.
func TestProbeTokenRotationLogsOnce(t *testing.T) {
	eng := newKeyedEngine(t, "sk-engine")
	var logs syncbuf.Buffer
	tr, err := NewTracker(TrackerConfig{ServiceID: 7, Endpoints: []int{0}, ProbeRetries: 2})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProber(tr, ProbeConfig{Type: "http", Path: "/v1/models", Interval: 10 * time.Millisecond, Timeout: 5 * time.Second,
		Token: staticToken{tok: "sk-engine"}}, []Target{eng.target(0)}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	eng.setKey("sk-rotated")
	waitFor(t, "probe down", func() bool { return tr.States().ProbeDown.Has(0) })
	time.Sleep(100 * time.Millisecond) // several more failing probes
	eng.setKey("sk-engine")
	waitFor(t, "probe up", func() bool { return !tr.States().ProbeDown.Has(0) })
	if n := strings.Count(logs.String(), "engine refused the token of backendTokenFile"); n != 1 {
		t.Fatalf("the refusal was logged %d times:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "sk-") {
		t.Fatalf("a token reached the log:\n%s", logs.String())
	}
}
