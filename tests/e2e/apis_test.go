package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
)

// sdkCall is one SDK call's summary printed by node/apis.mjs.
type sdkCall struct {
	Decision string          `json:"decision"`
	Engine   string          `json:"engine"`
	Cached   *string         `json:"cached"` // x-enginesim-cached-tokens (non-streamed answers only)
	Text     string          `json:"text"`
	Status   string          `json:"status"`
	Stop     string          `json:"stop"`
	Types    []string        `json:"types"`
	Usage    json.RawMessage `json:"usage"`
}

// TestConversationAPIsNodeSDKs drives the real kvgate daemon with the
// official OpenAI Node SDK (client.responses.create, streamed and not) and
// the official Anthropic SDK (client.messages.stream and .create) to two
// real enginesim processes. The second request of each API shares the
// first one's instructions or system prompt: it must be a tier-1.5 hit on
// the engine that served the first, and the engine's cached tokens must
// equal kvgate's matched blocks (kvgate computed vLLM's token ids for both
// APIs). It skips without node or the npm modules, unless
// KVGATE_REQUIRE_NODE is set (CI installs them with npm ci).
func TestConversationAPIsNodeSDKs(t *testing.T) {
	node, err := exec.LookPath("node")
	var modErr error
	for _, m := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join("node/node_modules", m, "package.json")); err != nil {
			modErr = err
		}
	}
	if err != nil || modErr != nil {
		if os.Getenv("KVGATE_REQUIRE_NODE") != "" {
			t.Fatalf("KVGATE_REQUIRE_NODE is set but node (%v) or a module in node/node_modules (%v) is missing; run npm ci in tests/e2e/node", err, modErr)
		}
		t.Skip("node or tests/e2e/node/node_modules missing (npm ci in tests/e2e/node); set KVGATE_REQUIRE_NODE to fail instead")
	}
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := buildCommands(t, "kvgate", "enginesim")
	block := testnet.Block(t)
	hosts := [2]string{block + "11", block + "12"}
	eport := testnet.Port(t, hosts[0])
	eng := startProc(t, []string{"PYTHONHASHSEED=0"}, filepath.Join(dir, "enginesim"), "--host", hosts[0], "--port", fmt.Sprint(eport),
		"--replicas", "2", "--model", model, "--tokenizer", repoTokenizerDir(t), "--time-scale", "0.05", "--log-level", "warn")
	waitFor(t, "the engines", 30*time.Second, func() bool {
		for _, h := range hosts {
			resp, err := http.Get(fmt.Sprintf("http://%s:%d/health", h, eport))
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		return true
	})
	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	gw := startProc(t, []string{"LLB_KV_NONE_HASH_SEED=0"}, filepath.Join(dir, "kvgate"), "--api", api, "--state-dir", t.TempDir(),
		"--tokenizer-dir", stagingDir(t), "--decision-header")
	tg := &testGateway{api: "http://" + api}
	waitFor(t, "the management API", 20*time.Second, func() bool {
		resp, err := http.Get(tg.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	vip, vport := block+"1", testnet.Port(t, block+"1")
	rule := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4,
		"kvExactMode":3,"kvZmqPort":5557,"kvHashAlgo":"sha256_cbor","kvBlockSize":16},
		"endpoints":[{"endpointIP":%q,"targetPort":%d,"weight":1},{"endpointIP":%q,"targetPort":%d,"weight":1}]}`,
		vip, vport, hosts[0], eport, hosts[1], eport)
	id := tg.createRule(t, []byte(rule))
	tg.waitSubscribed(t, id, 2)
	diag := func() string { return "\n--- kvgate:\n" + gw.logs.String() + "\n--- enginesim:\n" + eng.logs.String() }

	base := fmt.Sprintf("http://%s:%d", vip, vport)
	res := map[string]sdkCall{}
	run := func(call string) sdkCall {
		cmd := exec.Command(node, "apis.mjs", base, model, call)
		cmd.Dir = "node"
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node %s: %v\n%s%s", call, err, stderr.String(), diag())
		}
		var c sdkCall
		if err := json.Unmarshal(out, &c); err != nil {
			t.Fatalf("node %s output %q: %v", call, out, err)
		}
		res[call] = c
		return c
	}
	// The second call of each API may be sent only once kvgate holds the
	// blocks the first one stored (the KV events arrive asynchronously).
	blocks := func(ep string) float64 {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": strconv.Itoa(id), "ep_idx": ep})
	}
	for _, call := range []string{"responses", "responsesStream", "messagesStream", "messages"} {
		before := map[string]float64{"0": blocks("0"), "1": blocks("1")}
		c := run(call)
		if call == "responses" || call == "messagesStream" {
			ep := decisionField(c.Decision, "ep")
			waitFor(t, call+"'s blocks in kvgate", 10*time.Second, func() bool { return blocks(ep) > before[ep] })
		}
	}

	// Each API: the first call seeds an engine, the second (same prefix)
	// must hit it, and the engine's cached tokens are kvgate's matched blocks.
	cachedOf := map[string]func(c sdkCall) int{
		"responsesStream": func(c sdkCall) int {
			var u struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			}
			_ = json.Unmarshal(c.Usage, &u)
			return u.Details.Cached
		},
		"messages": func(c sdkCall) int {
			if c.Cached == nil {
				return -1
			}
			n, _ := strconv.Atoi(*c.Cached)
			return n
		},
	}
	pairs := []struct{ first, second string }{{"responses", "responsesStream"}, {"messagesStream", "messages"}}
	for _, p := range pairs {
		first, second := res[p.first], res[p.second]
		for name, c := range map[string]sdkCall{p.first: first, p.second: second} {
			if c.Text == "" || c.Decision == "" || !strings.HasPrefix(c.Engine, block) {
				t.Fatalf("%s through the SDK: %+v%s", name, c, diag())
			}
		}
		if decisionField(second.Decision, "tier") != "1.5" || second.Engine != first.Engine {
			t.Fatalf("%s: decision %q on %s, want a tier-1.5 hit on %s (the engine %s warmed)%s", p.second, second.Decision, second.Engine, first.Engine, p.first, diag())
		}
		score, _ := strconv.Atoi(decisionField(second.Decision, "score"))
		if cached := cachedOf[p.second](second); score < 2 || cached != score*16 {
			t.Fatalf("%s: kvgate matched %d blocks, the engine cached %d tokens%s", p.second, score, cached, diag())
		}
	}

	// The streams have each API's event sequence, as the SDKs parsed them.
	rs := res["responsesStream"].Types
	if len(rs) < 3 || rs[0] != "response.created" || rs[len(rs)-1] != "response.completed" || !slices.Contains(rs, "response.output_text.delta") {
		t.Fatalf("Responses API stream events %v", rs)
	}
	ms := res["messagesStream"].Types
	if len(ms) < 3 || ms[0] != "message_start" || ms[len(ms)-1] != "message_stop" || !slices.Contains(ms, "content_block_delta") {
		t.Fatalf("Messages API stream events %v", ms)
	}
	if res["messages"].Stop != "max_tokens" || res["responses"].Status != "incomplete" {
		t.Fatalf("8 output tokens end both answers: stop_reason %q, status %q", res["messages"].Stop, res["responses"].Status)
	}
	waitFor(t, "in-flight counts back to 0", 5*time.Second, func() bool {
		return tg.metric(t, "kvgate_endpoint_inflight", map[string]string{"service": strconv.Itoa(id)}) == 0
	})
}

// TestPDConversationAPIsSingleLeg: on a P/D mode-1 rule, /v1/messages and
// /v1/responses are KV-routed to a prefill endpoint and served there whole
// (docs/pd.md): the decode engine never sees them, and a second request
// sharing the system prompt is a tier-1.5 hit on the same prefill engine.
func TestPDConversationAPIsSingleLeg(t *testing.T) {
	engines, tg, id, u := startPD(t, pdTopology(), nil, nil)
	tg.waitSubscribed(t, id, 2)
	base := strings.TrimSuffix(u, "/v1/completions")
	svc := strconv.Itoa(id)
	tests := []struct {
		path        string
		first, warm map[string]any
	}{
		{"/v1/messages",
			map[string]any{"model": model, "max_tokens": 4, "system": preamble, "messages": []any{map[string]any{"role": "user", "content": "Where are the logs?"}}},
			map[string]any{"model": model, "max_tokens": 4, "system": []any{map[string]any{"type": "text", "text": preamble}}, "messages": []any{map[string]any{"role": "user", "content": "How do I restart a worker?"}}}},
		{"/v1/responses",
			map[string]any{"model": model, "max_output_tokens": 4, "instructions": preamble + " (responses)", "input": "Where are the logs?"},
			map[string]any{"model": model, "max_output_tokens": 4, "instructions": preamble + " (responses)", "input": []any{map[string]any{"role": "user", "content": "How do I restart a worker?"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			first := post(t, base+tc.path, tc.first)
			if first.status != 200 || (first.engine != "engine-0" && first.engine != "engine-2") {
				t.Fatalf("first: %d from %q: %s", first.status, first.engine, first.body)
			}
			ep := decisionField(first.decision, "ep")
			waitFor(t, "the prefill engine's blocks", 5*time.Second, func() bool {
				return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": ep}) >= 2
			})
			var cachedHeader string
			warm := postWith(t, base+tc.path, tc.warm, func(h http.Header) { cachedHeader = h.Get("x-enginesim-cached-tokens") })
			if warm.status != 200 || warm.engine != first.engine || decisionField(warm.decision, "tier") != "1.5" {
				t.Fatalf("warm: %d from %q, decision %q; want a tier-1.5 hit on %s", warm.status, warm.engine, warm.decision, first.engine)
			}
			if cached, _ := strconv.Atoi(cachedHeader); cached < 32 {
				t.Fatalf("warm: the prefill engine cached %d tokens", cached)
			}
		})
	}
	if n := engineMetric(t, engines[1], "vllm:request_success_total"); n != 0 {
		t.Fatalf("the decode engine served %v requests", n)
	}
	assertLoadsZero(t, tg, id)
}
