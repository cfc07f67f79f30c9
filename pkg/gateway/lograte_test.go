package gateway

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/pkg/config"
)

// TestUnknownModelWarningsRateLimited: requests that each name a different
// unstaged model write a bounded number of WARN lines (they wrote two per
// request before); the tokenize misses are still counted per request.
func TestUnknownModelWarningsRateLimited(t *testing.T) {
	var logs syncbuf.Buffer
	g, err := New(Options{Settings: config.DefaultSettings(), TokenizerDir: t.TempDir(), ShutdownGrace: time.Second,
		Limits: limitsForTest(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown()
	vip, port := freeAddr(t)
	_, dead := freeAddr(t)
	rule := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"mode":4,"kvExactMode":3,"kvZmqPort":1,"probetype":"none"},
		"endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d,"weight":1}]}`, vip, port, dead)
	id, err := g.API.Apply(mustRule(t, rule), nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := g.ProxyAddr(id)
	const requests = 20
	for i := range requests {
		resp, err := http.Post("http://"+addr.String()+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"unknown-%d","prompt":"hello there"}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var warns []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "tokenizer") {
			warns = append(warns, l)
		}
	}
	if len(warns) > 2 {
		t.Errorf("%d tokenizer WARN lines for %d requests, want at most 2:\n%s", len(warns), requests, strings.Join(warns, "\n"))
	}
	rec := getMetrics(t, g)
	prefix := fmt.Sprintf(`loxilb_pd_kv_tier15_miss_reason_total{reason="tokenize",service="%d"} `, id)
	var misses int
	for _, l := range strings.Split(rec, "\n") {
		if strings.HasPrefix(l, prefix) {
			fmt.Sscan(strings.TrimPrefix(l, prefix), &misses)
		}
	}
	if misses < requests { // re-routes after a refused connect count again
		t.Errorf("%d tokenize misses for %d requests:\n%s", misses, requests, grepLines(rec, "miss_reason"))
	}
}

// TestRateLimitedHandler: one record per (message, reason) per interval at
// WARN and above, the dropped count carried by the next one; INFO passes.
func TestRateLimitedHandler(t *testing.T) {
	var buf syncbuf.Buffer
	h := newRateLimitedHandler(slog.NewTextHandler(&buf, nil), time.Minute)
	now := time.Unix(1000, 0)
	h.st.now = func() time.Time { return now }
	log := slog.New(h).With("component", "x")
	for range 5 {
		log.Warn("load failed", "reason", "not_found")
		log.Warn("load failed", "reason", "parse")
		log.Info("loaded")
	}
	now = now.Add(time.Minute)
	log.Warn("load failed", "reason", "not_found")
	out := buf.String()
	for _, c := range []struct {
		frag string
		n    int
	}{{"reason=not_found", 2}, {"reason=parse", 1}, {"msg=loaded", 5}, {"suppressed=4", 1}} {
		if got := strings.Count(out, c.frag); got != c.n {
			t.Errorf("%q appears %d times, want %d:\n%s", c.frag, got, c.n, out)
		}
	}
}

func getMetrics(t *testing.T, g *Gateway) string {
	t.Helper()
	rec := httptest.NewRecorder()
	g.API.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func grepLines(s, frag string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, frag) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
