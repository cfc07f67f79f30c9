package gateway

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestInspectionBounds: a request that would cost too much to inspect is
// forwarded unrouted under guard reason tokenize, with the detail counted in
// kvgate_kv_skip_total{cause}; one within the bounds is hashed as before.
func TestInspectionBounds(t *testing.T) {
	pool := tokenizer.NewPool(stagedQwen3(t))
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	newRouter := func(t *testing.T, trust bool, maxTokens int, gate *inspectGate) (*router, *ruleState) {
		t.Helper()
		extra := ""
		if trust {
			extra = `,"trustRequestChatTemplate":true`
		}
		rule := mustRule(t, `{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3`+extra+
			`},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":10}]}`)
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
		return &router{service: 7, sel: sel, opts: selector.DefaultOptions(), pool: pool, log: quietLogger(), m: m,
			maxTokens: maxTokens, gate: gate}, st
	}
	body := func(v map[string]any) []byte {
		v["model"] = baseModel
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	long := strings.Repeat("route me by my prefix ", 20) // several 16-token blocks
	chat := []map[string]any{{"role": "user", "content": long}}
	ids := make([]int, 300)
	// A 231-byte template that builds a ~400 MB list through repeated
	// concatenation: the bound is in bytes, not in elements.
	bomb := `{% set ns = namespace(a=["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]) %}{% for i in range(22) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ ns.a|length }}{{ messages[0].content }}`
	full := newInspectGate(inspectFreeBytes+1, inspectFreeBytes, nil)
	if _, ok := full.acquire(inspectFreeBytes + 1); !ok { // another request holds the whole budget
		t.Fatal("could not fill the gate")
	}
	tests := []struct {
		name      string
		trust     bool
		maxTokens int
		gate      *inspectGate
		body      []byte
		cause     string // "" means hashed
	}{
		{"plain completion", false, 262144, nil, body(map[string]any{"prompt": long}), ""},
		{"15 MiB one-word prompt", false, 262144, nil, body(map[string]any{"prompt": strings.Repeat("a", 15<<20)}), causeWord},
		{"more tokens than LLB_KV_MAX_PROMPT_TOKENS", false, 100, nil, body(map[string]any{"prompt": strings.Repeat("route me ", 200)}), causeTokens},
		{"token ids above the limit", false, 100, nil, body(map[string]any{"prompt": ids}), causeTokens},
		{"token ids within the limit", false, 300, nil, body(map[string]any{"prompt": ids}), ""},
		{"chat within the limit", false, 262144, nil, body(map[string]any{"messages": chat}), ""},
		{"request template, rule does not trust it", false, 262144, nil, body(map[string]any{"messages": chat, "chat_template": "{{ messages[0].content }}"}), causeUntrusted},
		{"request template, trusted rule", true, 262144, nil, body(map[string]any{"messages": chat, "chat_template": "{{ messages[0].content }}"}), ""},
		{"hostile template, trusted rule", true, 262144, nil, body(map[string]any{"messages": chat, "chat_template": bomb}), causeTemplateCost},
		{"inspection budget in use", false, 262144, full, body(map[string]any{"prompt": strings.Repeat("big ", 70000)}), causeBusy},
		{"small body passes a full budget", false, 262144, full, body(map[string]any{"prompt": long}), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, st := newRouter(t, tc.trust, tc.maxTokens, tc.gate)
			before := testutil.ToFloat64(m.KVSkips.WithLabelValues("7", tc.cause))
			req := &fullproxy.Request{Target: apiPath(tc.body), BodyInspected: true, RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, Body: tc.body}
			sc := r.prepare(st, req)
			if tc.cause == "" {
				if sc.selReq.Upstream != selector.ReasonNone || len(sc.selReq.Hashes) == 0 {
					t.Fatalf("upstream %v, %d hashes: want hashed", sc.selReq.Upstream, len(sc.selReq.Hashes))
				}
				return
			}
			if sc.selReq.Upstream != selector.ReasonTokenize || len(sc.selReq.Hashes) != 0 {
				t.Fatalf("upstream %v, %d hashes: want reason tokenize", sc.selReq.Upstream, len(sc.selReq.Hashes))
			}
			if got := testutil.ToFloat64(m.KVSkips.WithLabelValues("7", tc.cause)) - before; got != 1 {
				t.Fatalf("kvgate_kv_skip_total{cause=%q} rose by %v, want 1", tc.cause, got)
			}
		})
	}
}

func TestInspectGate(t *testing.T) {
	g := newInspectGate(100, 10, recovery.New(quietLogger(), nil))
	steps := []struct {
		n  int
		ok bool
	}{{10, true}, {60, true}, {41, false}, {40, true}, {1, true}, {11, false}}
	var releases []func()
	for i, s := range steps {
		rel, ok := g.acquire(s.n)
		if ok != s.ok {
			t.Fatalf("step %d: acquire(%d) = %v, want %v (used %d)", i, s.n, ok, s.ok, g.used.Load())
		}
		if ok {
			releases = append(releases, rel)
		}
	}
	for _, rel := range releases {
		rel()
	}
	if g.used.Load() != 0 {
		t.Fatalf("used %d after every release", g.used.Load())
	}
}

// FuzzPrepare runs arbitrary bodies through the router's whole request side
// (facts, bounds, tokenize, hash) with a real tokenizer: never a panic, and
// a hashed request never exceeds the token bound.
func FuzzPrepare(f *testing.F) {
	for _, s := range []string{
		`{"model":"Qwen/Qwen3-0.6B","prompt":"hello world, hello world, hello world, hello world"}`,
		`{"model":"x","prompt":[]}`, `{"model":"x","prompt":[[]]}`, `{"model":"x","prompt":["a",5]}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`,
		`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}],"chat_template":"{{ messages }}"}`,
		`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"system","content":[{"type":"text","text":"s"}]},{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"` + strings.Repeat("a", 300) + `"}`,
	} {
		f.Add([]byte(s), false, uint8(1))
	}
	for path, s := range map[uint8]string{
		0: `{"model":"Qwen/Qwen3-0.6B","prompt":"hello world, hello world, hello world, hello world"}`,
		2: `{"model":"Qwen/Qwen3-0.6B","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}`,
		3: `{"model":"Qwen/Qwen3-0.6B","max_tokens":4,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"u"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}],"tools":[{"name":"f","input_schema":{}}]}`,
	} {
		f.Add([]byte(s), true, path)
	}
	src, err := filepath.Abs("../tokenizer/testdata/qwen3")
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	if err := os.Symlink(src, filepath.Join(dir, tokenizer.Slug(baseModel))); err != nil {
		f.Fatal(err)
	}
	pool := tokenizer.NewPool(dir)
	routers := map[bool]*router{}
	states := map[bool]*ruleState{}
	for _, trust := range []bool{false, true} {
		extra := ""
		if trust {
			extra = `,"trustRequestChatTemplate":true`
		}
		rule := &config.Rule{}
		if err := json.Unmarshal([]byte(`{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3`+extra+
			`},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":10}]}`), rule); err != nil {
			f.Fatal(err)
		}
		rule.AssignIndices(nil)
		st, err := newRuleState(rule, config.DefaultSettings(), quietLogger())
		if err != nil {
			f.Fatal(err)
		}
		sel, err := selector.New(selectorRule(rule), selector.DefaultOptions(), selector.Deps{})
		if err != nil {
			f.Fatal(err)
		}
		routers[trust] = &router{service: 1, sel: sel, opts: selector.DefaultOptions(), pool: pool, log: quietLogger(),
			maxTokens: 256, gate: newInspectGate(1<<20, 1<<10, nil)}
		states[trust] = st
	}
	f.Fuzz(func(t *testing.T, body []byte, trust bool, api uint8) {
		// The path decides how the body is read (reqfacts.KindFromPath):
		// every prompt-bearing API gets fuzzed bodies.
		path := fuzzPaths[int(api)%len(fuzzPaths)]
		req := &fullproxy.Request{Target: path, BodyInspected: true, RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, Body: body}
		sc := routers[trust].prepare(states[trust], req)
		if len(sc.selReq.Hashes) > 0 && sc.tokens > 256 {
			t.Fatalf("hashed %d tokens past the 256-token bound", sc.tokens)
		}
	})
}

// apiPath is the API path a test body is sent to: chat for a body with
// messages, else completions.
func apiPath(body []byte) string {
	if bytes.Contains(body, []byte(`"messages"`)) {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

var fuzzPaths = [...]string{"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"}
