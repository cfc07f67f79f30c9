package gateway

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

func readyz(t *testing.T, g *Gateway) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	g.API.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

func readyGauge(t *testing.T, g *Gateway) string {
	t.Helper()
	rec := httptest.NewRecorder()
	g.API.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, "kvgate_ready ") {
			return l
		}
	}
	return "kvgate_ready missing"
}

// waitReady polls /readyz (bounded) until it answers 200.
func waitReady(t *testing.T, g *Gateway) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a cold tokenizer load on a loaded 2-core machine
	for {
		code, body := readyz(t, g)
		if code == 200 {
			return body
		}
		if code != 503 || !strings.Contains(body, `"ready":false`) {
			t.Fatalf("/readyz answered %d %s", code, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 2 minutes: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStagedTokenizersPreload: the staged tokenizers load in the background
// at start, before any request, and /readyz with kvgate_ready reports when
// they have; a broken staged file does not hold readiness, and neither does
// a rule's LoRA base model that is not staged. A tokenizer staged later is
// loaded when a rule is created. Before the preloader, nothing loaded until
// the first request (all concurrent first requests paid the ~1 s load) and
// /readyz did not exist.
func TestStagedTokenizersPreload(t *testing.T) {
	dir := stagedQwen3(t)
	if err := os.MkdirAll(filepath.Join(dir, "broken__model"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken__model", "tokenizer.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "empty__dir"), 0o755); err != nil { // no tokenizer.json: not staged
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	g, err := New(Options{Settings: config.DefaultSettings(), TokenizerDir: dir, ShutdownGrace: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown()

	// Right after start the Qwen3 load (about a second) is still running.
	if code, body := readyz(t, g); code != 503 || !strings.Contains(body, `"Qwen/Qwen3-0.6B"`) || strings.Contains(body, "empty/dir") {
		t.Errorf("/readyz at start: %d %s", code, body)
	} else if l := readyGauge(t, g); l != "kvgate_ready 0" {
		t.Errorf("gauge while loading: %s", l)
	}
	if body := waitReady(t, g); body != `{"ready":true,"pending":[]}` {
		t.Errorf("/readyz when ready: %s", body)
	}
	if l := readyGauge(t, g); l != "kvgate_ready 1" {
		t.Errorf("gauge when ready: %s", l)
	}
	if !strings.Contains(logs.String(), `msg="tokenizer loaded" model=Qwen/Qwen3-0.6B`) {
		t.Errorf("Qwen3 was not loaded before any request:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "model=broken/model") {
		t.Errorf("the broken tokenizer was not attempted:\n%s", logs.String())
	}

	// Staged after start: loaded when a rule is created. The rule's LoRA base
	// model is not staged and must not block readiness.
	src, err := filepath.Abs("../tokenizer/testdata/llama3")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src, filepath.Join(dir, tokenizer.Slug("meta-llama/Llama-3.1-8B"))); err != nil {
		t.Fatal(err)
	}
	vip, port := freeAddr(t)
	_, dead := freeAddr(t)
	rule := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"mode":4,"kvExactMode":3,"kvZmqPort":1,"probetype":"none",
		"kvLoraAdapters":["sql=not-staged/base"]},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d,"weight":1}]}`, vip, port, dead)
	if _, err := g.API.Apply(mustRule(t, rule), nil); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, g); code != 503 || !strings.Contains(body, "meta-llama/Llama-3.1-8B") || strings.Contains(body, "not-staged") {
		t.Errorf("/readyz after the rule: %d %s", code, body)
	}
	waitReady(t, g)
	if !strings.Contains(logs.String(), `msg="tokenizer loaded" model=meta-llama/Llama-3.1-8B`) {
		t.Errorf("the newly staged tokenizer was not loaded on rule creation")
	}
}

// TestReadyWithNothingStaged: an empty or missing staging directory is ready at once.
func TestReadyWithNothingStaged(t *testing.T) {
	for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "missing")} {
		g, err := New(Options{Settings: config.DefaultSettings(), TokenizerDir: dir, Logger: quietLogger(), ShutdownGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if code, body := readyz(t, g); code != 200 || body != `{"ready":true,"pending":[]}` {
			t.Errorf("%s: %d %s", dir, code, body)
		}
		if l := readyGauge(t, g); l != "kvgate_ready 1" {
			t.Errorf("%s: %s", dir, l)
		}
		g.Shutdown()
	}
}

// TestPreloadReleasesGarbage: once the preload queue is empty after a load
// (successful or not), the preloader asks once for the freed memory to be
// returned (parsing a tokenizer.json leaves about twice the tokenizer as
// garbage, which an idle daemon kept resident); a scan that queues nothing
// asks for nothing. Before, the preloader never released.
func TestPreloadReleasesGarbage(t *testing.T) {
	llama2, err := filepath.Abs("../tokenizer/testdata/llama2")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		stage  func(t *testing.T, dir string)
		wantAt int // releases once ready
	}{
		{"nothing staged", func(*testing.T, string) {}, 0},
		{"one tokenizer", func(t *testing.T, dir string) {
			if err := os.Symlink(llama2, filepath.Join(dir, "meta-llama__Llama-2-7b")); err != nil {
				t.Fatal(err)
			}
		}, 1},
		{"two tokenizers and a broken one: one release", func(t *testing.T, dir string) {
			for _, m := range []string{"a__one", "b__two"} {
				if err := os.Symlink(llama2, filepath.Join(dir, m)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(dir, "broken__model"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "broken__model", "tokenizer.json"), []byte("{not json"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.stage(t, dir)
			var releases atomic.Int32
			p := newPreloader(tokenizer.NewPool(dir, tokenizer.WithLogger(quietLogger())), dir, quietLogger(),
				func(bool) {}, func() { releases.Add(1) }, nil)
			defer p.close()
			p.scan()
			waitReleases(t, &releases, tc.wantAt)
			p.scan() // nothing new staged
			time.Sleep(50 * time.Millisecond)
			if got := releases.Load(); got != int32(tc.wantAt) {
				t.Errorf("releases after an empty scan = %d, want %d", got, tc.wantAt)
			}
		})
	}
}

// waitReleases waits (bounded) until the preloader is idle with want
// releases asked for.
func waitReleases(t *testing.T, releases *atomic.Int32, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // loads on a loaded 2-core machine
	for releases.Load() < int32(want) {
		if time.Now().After(deadline) {
			t.Fatalf("releases = %d after a minute, want %d", releases.Load(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
