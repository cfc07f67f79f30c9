package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestStatusPageInBrowser loads the status page (GET / on the API) in Debian's
// headless chromium against a live gateway with two engines and checks the
// rendered DOM: one rule section, a row per endpoint with its discovered
// model, and an endpoint hit
// counter that moves after a warm request. It skips without chromium unless
// KVGATE_REQUIRE_BROWSER is set (CI installs chromium). With
// KVGATE_WRITE_SCREENSHOT=path it also saves a screenshot there (the one in
// docs/ was made so).
func TestStatusPageInBrowser(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("KVGATE_REQUIRE_BROWSER") != "" {
			t.Fatal("KVGATE_REQUIRE_BROWSER is set but chromium is not installed (apt-get install chromium)")
		}
		t.Skip("chromium not installed; set KVGATE_REQUIRE_BROWSER to fail instead")
	}
	_, tg, id, base := startMode3(t, []engineSpec{{}, {}}, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.Headless, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 720))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()

	rule := fmt.Sprintf(`section.rule-row[data-service="%d"]`, id)
	if err := chromedp.Do(bctx, chromedp.Navigate(tg.api+"/"), chromedp.WaitVisible(chromedp.CSS(rule))); err != nil {
		t.Fatalf("load the status page: %v", err)
	}
	rows, err := chromedp.Run(bctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll('%s tr.ep-row').length`, rule)))
	if err != nil {
		t.Fatalf("count the endpoint rows: %v", err)
	}
	if rows != 2 {
		t.Fatalf("the page shows %d endpoint rows, want 2", rows)
	}
	// Each endpoint's models cell shows what discovery read from its /v1/models.
	modelsJS := fmt.Sprintf(`[...document.querySelectorAll('%s tr.ep-row td.models')].map((td) => td.textContent)`, rule)
	var cells []string
	waitFor(t, "the models cells", 15*time.Second, func() bool {
		cells, err = chromedp.Run(bctx, chromedp.Evaluate[[]string](modelsJS))
		if err != nil {
			t.Fatalf("read the models cells: %v", err)
		}
		return len(cells) == 2 && strings.HasPrefix(cells[0], model+"read ") && strings.HasPrefix(cells[1], model+"read ")
	})
	for _, c := range cells {
		if !strings.Contains(c, "read ") || strings.Contains(c, "read failed") {
			t.Fatalf("models cell %q: want the model and when it was read, without a failure", c)
		}
	}
	hits := func() float64 {
		js := fmt.Sprintf(`[...document.querySelectorAll('%s td.hits-total')].reduce((a, td) => a + Number(td.textContent), 0)`, rule)
		sum, err := chromedp.Run(bctx, chromedp.Evaluate[float64](js))
		if err != nil {
			t.Fatalf("read the hit counters: %v", err)
		}
		return sum
	}
	if h := hits(); h != 0 {
		t.Fatalf("hit counters show %v before any request", h)
	}

	// A cold request stores the prefix; a warm one sharing it is a hit.
	url := base + "/v1/completions"
	pre := tokenIDs(1000, 32)
	if r := post(t, url, map[string]any{"model": model, "prompt": append(append([]int{}, pre...), tokenIDs(5000, 8)...), "max_tokens": 2}); r.status != 200 {
		t.Fatalf("cold request: %d %s", r.status, r.body)
	}
	waitFor(t, "the cold engine's blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": strconv.Itoa(id)}) >= 2
	})
	if r := post(t, url, map[string]any{"model": model, "prompt": append(append([]int{}, pre...), tokenIDs(7000, 6)...), "max_tokens": 2}); r.status != 200 {
		t.Fatalf("warm request: %d %s", r.status, r.body)
	}
	waitFor(t, "the page's hit counter to move", 15*time.Second, func() bool { return hits() >= 1 })

	sub, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(rule+` tr.ep-row td:nth-child(9)`)))
	if err != nil {
		t.Fatal(err)
	}
	if len(sub) < len("connected") || sub[:len("connected")] != "connected" {
		t.Fatalf("subscriber cell %q, want it connected", sub)
	}
	if path := os.Getenv("KVGATE_WRITE_SCREENSHOT"); path != "" {
		// Some history for the spark lines and a probe result first.
		for i := range 8 {
			post(t, url, map[string]any{"model": model, "prompt": append(append([]int{}, pre...), tokenIDs(9000+10*i, 6)...), "max_tokens": 2})
			time.Sleep(2 * time.Second)
		}
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
