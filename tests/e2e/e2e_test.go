package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
)

func assertLoadsZero(t *testing.T, tg *testGateway, service int) {
	t.Helper()
	loads, ok := tg.g.Loads(service)
	if !ok {
		t.Fatalf("service %d unknown", service)
	}
	waitFor(t, "in-flight counts back to 0", 3*time.Second, func() bool { return loads.Total() == 0 })
}

// preamble is a system text long enough for several 16-token blocks.
const preamble = "You are the support assistant of a large inference platform. Answer briefly, cite the runbook " +
	"section you used, never invent metrics, and escalate anything about data loss to the on-call engineer. " +
	"The platform routes requests across GPU workers; each worker keeps a prefix cache of KV blocks."

// TestGoNoGoGate is docs/deploy.md's go/no-go gate on a mode-1 (P/D) rule
// with EP0 and EP2 prefill and EP1 decode: the subscriber count equals the
// prefill endpoints, the inventory fills after a cold request, a warm
// request sharing the prefix raises tier15_hits_total{ep_idx} of the
// expected prefill endpoint by exactly one, and delivery is proven
// (docs/deploy.md's "dual proof"): the decision names that endpoint, the answer comes
// from the decode engine (x-engine-id), the prefill leg hit the cached
// prefix there (usage.cached_tokens, copied from the prefill response), and
// the other prefill engine never saw the prompt.
func TestGoNoGoGate(t *testing.T) {
	block := testnet.Block(t)
	engines, zmq := startEngines(t, block, pdTopology())
	tg := startGateway(t, block)
	id, base := createKVRule(t, tg, block+"1", engines, pdRoles, map[string]any{
		"kvExactMode": 1, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16, "kvWarmupSec": 30,
	})
	svc := strconv.Itoa(id)

	// Step 3: one subscriber per prefill endpoint.
	tg.waitSubscribed(t, id, 2)
	if n := tg.metric(t, "loxilb_kv_subscriber_connected", map[string]string{"service": svc}); n != 2 {
		t.Fatalf("subscribers connected = %v, want 2 (the prefill endpoints)", n)
	}
	url := base + "/v1/completions"

	// Cold request: the inventory fills.
	cold := post(t, url, map[string]any{"model": model, "prompt": preamble + " Question: how do I drain a worker?", "max_tokens": 2})
	if cold.status != 200 {
		t.Fatalf("cold request: %d %s", cold.status, cold.body)
	}
	coldEP, _ := strconv.Atoi(decisionField(cold.decision, "ep"))
	if (coldEP != 0 && coldEP != 2) || decisionField(cold.decision, "decode") != "1" || cold.engine != "engine-1" {
		t.Fatalf("cold request: decision %q answered by %q; want prefill 0 or 2, decode 1", cold.decision, cold.engine)
	}
	waitFor(t, "loxilb_pd_kv_blocks > 0", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": strconv.Itoa(coldEP)}) > 0
	})

	// Warm request sharing the prefix: exactly one more hit for that endpoint.
	hits := func() float64 {
		return tg.metric(t, "loxilb_pd_kv_tier15_hits_total", map[string]string{"ep_idx": strconv.Itoa(coldEP)})
	}
	before := hits()
	warm := post(t, url, map[string]any{"model": model, "prompt": preamble + " Question: where are the logs?", "max_tokens": 2})
	if warm.status != 200 {
		t.Fatalf("warm request: %d %s", warm.status, warm.body)
	}
	if d := hits() - before; d != 1 {
		t.Fatalf("tier15_hits_total{ep_idx=%d} rose by %v, want exactly 1 (decision %q)", coldEP, d, warm.decision)
	}
	if decisionField(warm.decision, "tier") != "1.5" || decisionField(warm.decision, "ep") != strconv.Itoa(coldEP) || warm.engine != "engine-1" {
		t.Fatalf("dual proof: warm decision %q answered by %q; want tier 1.5 on ep %d, decode engine-1", warm.decision, warm.engine, coldEP)
	}
	if warm.cached() == 0 {
		t.Fatalf("dual proof: the prefill leg reports no cached tokens for the warm request: %s", warm.body)
	}
	other := engines[2-coldEP]
	if st, err := other.Stats(context.Background()); err != nil || st.CachedBlocks != 0 {
		t.Fatalf("the other prefill engine holds %d blocks (err %v); it should never have seen the prompt", st.CachedBlocks, err)
	}
	assertLoadsZero(t, tg, id)
}

// TestWorkedExampleMode3 is the worked example (docs/pd.md) on a single-pool rule:
// two prompts share a 32-token preamble (two full blocks); the second goes
// where the first went, through tier 1.5 with score 2.
func TestWorkedExampleMode3(t *testing.T) {
	_, tg, id, base := startMode3(t, []engineSpec{{}, {}, {}}, nil)
	url := base + "/v1/completions"

	pre := tokenIDs(1000, 32)
	promptA := append(append([]int{}, pre...), tokenIDs(5000, 8)...) // 40 tokens: B1, B2, partial B3
	promptB := append(append([]int{}, pre...), tokenIDs(7000, 6)...) // 38 tokens: B1, B2, partial B3'

	a := post(t, url, map[string]any{"model": model, "prompt": promptA, "max_tokens": 2})
	if a.status != 200 || decisionField(a.decision, "tier") != "3" {
		t.Fatalf("cold request: %d decision %q (want the rule selector, tier 3): %s", a.status, a.decision, a.body)
	}
	epA := decisionField(a.decision, "ep")
	waitFor(t, "the cold engine's blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": strconv.Itoa(id), "ep_idx": epA}) >= 2
	})
	b := post(t, url, map[string]any{"model": model, "prompt": promptB, "max_tokens": 2})
	if b.status != 200 {
		t.Fatalf("warm request: %d %s", b.status, b.body)
	}
	want := fmt.Sprintf("tier=1.5; ep=%s; score=2; reason=hit", epA)
	if b.decision != want || b.engine != a.engine {
		t.Fatalf("warm request: decision %q engine %q; want %q on %q", b.decision, b.engine, want, a.engine)
	}
	if b.cached() != 32 {
		t.Fatalf("engine reports %d cached tokens, want 32 (B1, B2)", b.cached())
	}
	assertLoadsZero(t, tg, id)
}

// TestChatSharedSystemPrompt: two chat requests sharing a system prompt hit
// the same engine, and kvgate's view of them equals the engine's, which
// tokenizes like vLLM: the same prompt token count, and a matched-block score
// that is exactly the engine's cached prefix.
func TestChatSharedSystemPrompt(t *testing.T) {
	_, tg, id, base := startMode3(t, []engineSpec{{}, {}, {}}, nil)
	url := base + "/v1/chat/completions"
	chat := func(user any) reply {
		r := post(t, url, map[string]any{"model": model, "max_tokens": 2, "messages": []map[string]any{
			{"role": "system", "content": preamble},
			{"role": "user", "content": user},
		}})
		if r.status != 200 {
			t.Fatalf("chat: %d %s", r.status, r.body)
		}
		return r
	}
	first := chat("How do I drain a worker before maintenance?")
	ep := decisionField(first.decision, "ep")
	waitFor(t, "the first engine's blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": strconv.Itoa(id), "ep_idx": ep}) > 0
	})
	// Content as a list of text parts: vLLM joins them; the prefix is unchanged.
	second := chat([]map[string]any{{"type": "text", "text": "Where are the"}, {"type": "text", "text": "router logs kept?"}})
	if decisionField(second.decision, "tier") != "1.5" || second.engine != first.engine {
		t.Fatalf("second chat: decision %q on %q, want tier 1.5 on %q", second.decision, second.engine, first.engine)
	}
	score, _ := strconv.Atoi(decisionField(second.decision, "score"))
	if score == 0 || score*16 != second.cached() {
		t.Fatalf("hash parity: kvgate matched %d blocks (%d tokens), the engine cached %d tokens", score, score*16, second.cached())
	}
	// Token parity: kvgate's prompt token count equals the engine's.
	var logged []int
	waitFor(t, "two access-log lines", 3*time.Second, func() bool {
		logged = logged[:0]
		for _, l := range accessRecords(tg.access) {
			if n, ok := l["prompt_tokens"].(float64); ok {
				logged = append(logged, int(n))
			}
		}
		return len(logged) >= 2
	})
	if len(logged) != 2 || logged[0] != first.usage.PromptTokens || logged[1] != second.usage.PromptTokens {
		t.Fatalf("prompt tokens: kvgate %v, engine [%d %d]", logged, first.usage.PromptTokens, second.usage.PromptTokens)
	}
	assertLoadsZero(t, tg, id)
}

// TestOpenAINodeSDKStreaming drives the proxy with the official OpenAI Node
// SDK (npm openai), streaming. It skips when node or the npm modules are
// missing, unless KVGATE_REQUIRE_NODE is set (CI installs them with npm ci).
func TestOpenAINodeSDKStreaming(t *testing.T) {
	node, err := exec.LookPath("node")
	_, modErr := os.Stat("node/node_modules/openai/package.json")
	if err != nil || modErr != nil {
		if os.Getenv("KVGATE_REQUIRE_NODE") != "" {
			t.Fatalf("KVGATE_REQUIRE_NODE is set but node (%v) or node/node_modules/openai (%v) is missing; run npm ci in tests/e2e/node", err, modErr)
		}
		t.Skip("node or tests/e2e/node/node_modules missing (npm ci in tests/e2e/node); set KVGATE_REQUIRE_NODE to fail instead")
	}
	_, tg, id, base := startMode3(t, []engineSpec{{}, {}}, nil)

	cmd := exec.Command(node, "stream.mjs", base+"/v1", model)
	cmd.Dir = "node"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var res struct {
		Chat struct {
			Chunks   int    `json:"chunks"`
			Text     string `json:"text"`
			Finish   string `json:"finish"`
			Engine   string `json:"engine"`
			Decision string `json:"decision"`
			Usage    *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		} `json:"chat"`
		Completion struct {
			Chunks int    `json:"chunks"`
			Text   string `json:"text"`
		} `json:"completion"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	c := res.Chat
	if c.Chunks < 2 || c.Text == "" || c.Finish == "" || c.Usage == nil || c.Usage.PromptTokens == 0 || c.Usage.CompletionTokens != 8 {
		t.Fatalf("chat stream through the SDK: %+v", c)
	}
	if !strings.HasPrefix(c.Engine, "engine-") || c.Decision == "" {
		t.Fatalf("headers through the SDK: engine %q decision %q", c.Engine, c.Decision)
	}
	if res.Completion.Chunks < 1 || res.Completion.Text == "" {
		t.Fatalf("completion stream through the SDK: %+v", res.Completion)
	}
	assertLoadsZero(t, tg, id)
}

// TestGracefulShutdownWithStreamInFlight runs the real kvgate binary: a
// stream in flight when SIGTERM arrives completes, and the process exits 0.
func TestGracefulShutdownWithStreamInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	bin := filepath.Join(buildCommands(t, "kvgate"), "kvgate")
	block := testnet.Block(t)
	engines, _ := startEngines(t, block, []engineSpec{{role: enginesim.RoleBoth, decodeTS: 25}})
	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	daemon := exec.Command(bin, "--api", api, "--state-dir", t.TempDir(), "--tokenizer-dir", stagingDir(t),
		"--shutdown-grace", "20s", "--decision-header")
	daemon.Env = append(os.Environ(), "LLB_KV_NONE_HASH_SEED=0")
	var logs strings.Builder
	daemon.Stderr = &logs
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	t.Cleanup(func() {
		_ = daemon.Process.Kill()
		<-exited
	})
	tg := &testGateway{api: "http://" + api}
	waitFor(t, "the management API", 20*time.Second, func() bool {
		resp, err := http.Get(tg.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	vip, port := block+"1", testnet.Port(t, block+"1")
	tg.createRule(t, ruleJSON(t, vip, port, nil, engines, nil))

	body := fmt.Sprintf(`{"model":%q,"prompt":"count slowly","max_tokens":30,"stream":true}`, model)
	resp, err := http.Post(fmt.Sprintf("http://%s:%d/v1/completions", vip, port), "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream has started
		t.Fatalf("first event: %v", err)
	}
	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream cut by the shutdown: %v\n%s", err, logs.String())
	}
	if !strings.Contains(string(rest), "data: [DONE]") || strings.Count(string(rest), "data: {") < 25 {
		t.Fatalf("stream incomplete after SIGTERM: %q", rest)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("kvgate exited with %v\n%s", err, logs.String())
		}
		exited <- nil
	case <-time.After(15 * time.Second):
		t.Fatalf("kvgate did not exit after the stream ended\n%s", logs.String())
	}
}
