package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSteppedCachedTokens runs the default profile (at a hundredth of real
// time) through the HTTP API: cached_tokens and the floor((n-1)/bs) cap are
// the same as under the simple model.
func TestSteppedCachedTokens(t *testing.T) {
	e := startEngine(t, Config{PerfModel: DefaultPerfModel, TimeScale: 0.01})
	tests := []struct {
		name       string
		prompt     []uint32
		wantCached []int
	}{
		{"exact two blocks", seqIDs(1000, 32), []int{0, 16, 16}},
		{"partial third block", seqIDs(2000, 40), []int{0, 32, 32}},
		{"under one block", seqIDs(3000, 15), []int{0, 0}},
		{"long prompt over the step budget", seqIDs(5000, 9000), []int{0, 8992}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range tc.wantCached {
				r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": tc.prompt, "max_tokens": 3})
				c := decodeCompletion(t, r)
				if got := c.Usage.PromptTokensDetails.CachedTokens; got != want {
					t.Errorf("request %d: cached_tokens %d, want %d", i, got, want)
				}
				if c.Usage.CompletionTokens != 3 {
					t.Errorf("usage %+v", c.Usage)
				}
			}
		})
	}
}

// TestStreamHeadBeforeFirstToken: the status and headers of a streamed
// response arrive while the request's first token is still far off (a step
// takes 30 s here), as vLLM's StreamingResponse sends them; the first body
// byte is the first token.
func TestStreamHeadBeforeFirstToken(t *testing.T) {
	for _, model := range []string{DefaultPerfModel, PerfModelSimple} {
		t.Run(model, func(t *testing.T) {
			cfg := Config{PerfModel: model, DebugState: true}
			if model == PerfModelSimple {
				cfg.TTFTFloor = 30 * time.Second
			} else {
				cfg.Step = StepPerf{StepFloorS: 30}
			}
			e := startEngine(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("no head before the first token: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || resp.Header.Get("x-engine-id") != e.ID() {
				t.Fatalf("head %d %v", resp.StatusCode, resp.Header)
			}
			if _, ok := resp.Trailer[http.CanonicalHeaderKey("x-enginesim-ttft-us")]; !ok {
				t.Errorf("trailers %v do not announce the model figures", resp.Trailer)
			}
			var st debugState
			r := getJSON(t, e.URL()+"/debug/state", &st)
			if r != 200 || st.Running+st.Waiting != 1 || st.PendingPrefillTokens == 0 {
				t.Fatalf("with the head out the request should still be prefilling: %d %+v", r, st)
			}
		})
	}
}

// TestStreamTrailers: a streamed response ends with the model's figures as
// trailers, and its first event is the role chunk carrying the first token's
// turn.
func TestStreamTrailers(t *testing.T) {
	e := startEngine(t, Config{PerfModel: DefaultPerfModel, TimeScale: 0.01})
	body := `{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18],"max_tokens":2,"stream":true}`
	for i, wantCached := range []string{"0", "16"} {
		resp, err := http.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		n := 0
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				n++
			}
		}
		resp.Body.Close()
		if n < 3 {
			t.Errorf("request %d: %d events", i, n)
		}
		if got := resp.Trailer.Get("x-enginesim-cached-tokens"); got != wantCached {
			t.Errorf("request %d: trailer cached tokens %q, want %s (trailers %v)", i, got, wantCached, resp.Trailer)
		}
		if resp.Trailer.Get("x-enginesim-ttft-us") == "" {
			t.Errorf("request %d: no ttft trailer", i)
		}
	}
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}
