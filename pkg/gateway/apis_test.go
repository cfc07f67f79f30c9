package gateway

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPromptBearingPaths: the path decides how a body is read. A Messages or
// Responses body hashes exactly as the chat conversation vLLM converts it
// into (before, an Anthropic body was read as OpenAI chat, its system prompt
// dropped, and its hashes matched nothing the engine stored); a body sent to
// a path that is no prompt-bearing API is forwarded with text_empty and
// counted as kvgate_kv_skip_total{cause="path"}; an image is a tokenize
// miss counted as cause "multimodal".
func TestPromptBearingPaths(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	rule := mustRule(t, `{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":10}]}`)
	rule.AssignIndices(nil)
	if err := config.Validate(rule, config.DefaultSettings()); err != nil {
		t.Fatal(err)
	}
	st, err := newRuleState(rule, config.DefaultSettings(), quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	sel, err := selector.New(selectorRule(rule), selector.DefaultOptions(), selector.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	r := &router{service: 8, sel: sel, opts: selector.DefaultOptions(), pool: tokenizer.NewPool(stagedQwen3(t)), log: quietLogger(), m: m,
		maxTokens: 262144, gate: newInspectGate(1<<30, 1<<20, nil)}
	prepare := func(path, body string) *plan {
		req := &fullproxy.Request{Method: "POST", Target: path, BodyInspected: true, RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, Body: []byte(body)}
		return r.prepare(st, req)
	}
	system := strings.Repeat("You route requests by their KV cache. ", 6)
	user := strings.Repeat("Which engine holds my prefix? ", 4)
	chat := prepare("/v1/chat/completions", `{"model":"`+baseModel+`","messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"`+user+`"}]}`)
	if len(chat.selReq.Hashes) < 3 {
		t.Fatalf("chat request: %d hashes", len(chat.selReq.Hashes))
	}
	userOnly := prepare("/v1/chat/completions", `{"model":"`+baseModel+`","messages":[{"role":"user","content":"`+user+`"}]}`)

	tests := []struct {
		name, path, body string
		want             []uint64 // nil: no hashes
		upstream         selector.Reason
		hasText          bool
		cause            string
	}{
		{name: "messages with a system prompt", path: "/v1/messages",
			body: `{"model":"` + baseModel + `","max_tokens":8,"system":"` + system + `","messages":[{"role":"user","content":"` + user + `"}]}`,
			want: chat.selReq.Hashes, hasText: true},
		{name: "messages with system text blocks", path: "/v1/messages",
			body: `{"model":"` + baseModel + `","max_tokens":8,"system":[{"type":"text","text":"` + system + `"}],"messages":[{"role":"user","content":[{"type":"text","text":"` + user + `"}]}]}`,
			want: chat.selReq.Hashes, hasText: true},
		{name: "the same body on the chat path is chat without the system prompt", path: "/v1/chat/completions",
			body: `{"model":"` + baseModel + `","max_tokens":8,"system":"` + system + `","messages":[{"role":"user","content":"` + user + `"}]}`,
			want: userOnly.selReq.Hashes, hasText: true},
		{name: "responses with instructions", path: "/v1/responses",
			body: `{"model":"` + baseModel + `","instructions":"` + system + `","input":"` + user + `"}`,
			want: chat.selReq.Hashes, hasText: true},
		{name: "responses with message items", path: "/v1/responses",
			body: `{"model":"` + baseModel + `","input":[{"type":"message","role":"system","content":"` + system + `"},{"role":"user","content":[{"type":"input_text","text":"` + user + `"}]}]}`,
			want: chat.selReq.Hashes, hasText: true},
		{name: "embeddings", path: "/v1/embeddings", body: `{"model":"` + baseModel + `","input":"` + user + `"}`, cause: "path"},
		{name: "completion body to an unknown path", path: "/generate", body: `{"model":"` + baseModel + `","prompt":"` + user + `"}`, cause: "path"},
		{name: "image block", path: "/v1/messages",
			body:     `{"model":"` + baseModel + `","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://127.0.0.1/x.png"}},{"type":"text","text":"what is it?"}]}]}`,
			upstream: selector.ReasonTokenize, hasText: true, cause: "multimodal"},
		{name: "responses input_image", path: "/v1/responses",
			body:     `{"model":"` + baseModel + `","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]}`,
			upstream: selector.ReasonTokenize, hasText: true, cause: "multimodal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := 0.0
			if tc.cause != "" {
				before = testutil.ToFloat64(m.KVSkips.WithLabelValues("8", tc.cause))
			}
			sc := prepare(tc.path, tc.body)
			if sc.selReq.HasText != tc.hasText || sc.selReq.Upstream != tc.upstream {
				t.Fatalf("has text %v, upstream %v (problem %q); want %v, %v", sc.selReq.HasText, sc.selReq.Upstream, sc.facts.Problem, tc.hasText, tc.upstream)
			}
			if !slices.Equal(sc.selReq.Hashes, tc.want) {
				t.Fatalf("hashes %x, want %x", sc.selReq.Hashes, tc.want)
			}
			if tc.cause != "" {
				if got := testutil.ToFloat64(m.KVSkips.WithLabelValues("8", tc.cause)) - before; got != 1 {
					t.Fatalf("kvgate_kv_skip_total{cause=%q} rose by %v, want 1", tc.cause, got)
				}
			}
		})
	}
	if slices.Equal(chat.selReq.Hashes, userOnly.selReq.Hashes) {
		t.Fatal("the system prompt does not change the hashes: the test proves nothing")
	}
}
