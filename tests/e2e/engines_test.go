package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
)

// TestGoNoGoGateSGLang is the spec's §9 go/no-go gate for kvEngineType
// sglang on a single-pool rule over three SGLang engines (enginesim
// --engine sglang, page size 16, no kvHashAlgo: the engine's default
// sha256_sglang): one subscriber per endpoint (step 3), the inventory fills
// after a cold request (steps 1-2), a warm request sharing the prefix
// raises tier15_hits_total of that endpoint by exactly one and leaves
// fallthrough flat, and delivery is proven: the engine that answers is the
// one that cached the prefix and reports cached tokens, while the other
// engines never saw the prompt.
func TestGoNoGoGateSGLang(t *testing.T) {
	block := testnet.Block(t)
	sg := engineSpec{engine: enginesim.EngineSGLang, blockSize: 16}
	engines, zmq := startEngines(t, block, []engineSpec{sg, sg, sg})
	tg := startGateway(t, block)
	id, base := createKVRule(t, tg, block+"1", engines, nil, map[string]any{
		"kvExactMode": 3, "kvEngineType": "sglang", "kvZmqPort": zmq, "kvBlockSize": 16,
	})
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 3)
	url := base + "/v1/completions"

	cold := post(t, url, map[string]any{"model": model, "prompt": preamble + " Question: how do I drain a worker?", "max_tokens": 2})
	if cold.status != 200 || decisionField(cold.decision, "tier") != "3" {
		t.Fatalf("cold request: %d decision %q (want the rule selector, tier 3): %s", cold.status, cold.decision, cold.body)
	}
	ep := decisionField(cold.decision, "ep")
	waitFor(t, "loxilb_pd_kv_blocks > 0", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": ep}) > 0
	})
	hits := func() float64 { return tg.metric(t, "loxilb_pd_kv_tier15_hits_total", map[string]string{"ep_idx": ep}) }
	fall := func() float64 {
		return tg.metric(t, "loxilb_pd_kv_tier15_fallthrough_total", map[string]string{"service": svc})
	}
	hitsBefore, fallBefore := hits(), fall()
	warm := post(t, url, map[string]any{"model": model, "prompt": preamble + " Question: where are the logs?", "max_tokens": 2})
	if warm.status != 200 {
		t.Fatalf("warm request: %d %s", warm.status, warm.body)
	}
	if d := hits() - hitsBefore; d != 1 {
		t.Fatalf("tier15_hits_total{ep_idx=%s} rose by %v, want exactly 1 (decision %q)", ep, d, warm.decision)
	}
	if d := fall() - fallBefore; d != 0 {
		t.Fatalf("tier15_fallthrough_total rose by %v under warm traffic", d)
	}
	if decisionField(warm.decision, "tier") != "1.5" || decisionField(warm.decision, "ep") != ep || warm.engine != cold.engine {
		t.Fatalf("warm decision %q answered by %q; want tier 1.5 on ep %s, engine %q", warm.decision, warm.engine, ep, cold.engine)
	}
	if warm.cached() == 0 {
		t.Fatalf("the SGLang engine reports no cached tokens for the warm request: %s", warm.body)
	}
	for i, e := range engines {
		if e.ID() == cold.engine {
			continue
		}
		if st, err := e.Stats(context.Background()); err != nil || st.CachedBlocks != 0 {
			t.Fatalf("engine %d holds %d blocks (err %v); it should never have seen the prompt", i, st.CachedBlocks, err)
		}
	}
	assertLoadsZero(t, tg, id)
}

// TestSGLangPageSizeMismatch: SGLang engines with 32-token pages behind a
// rule with kvBlockSize 16. SGLang publishes one hash per whole page, so no
// 16-token chain can match; the requests skip the KV tier by name (guard
// hashes, kvgate_kv_skip_total{cause="block_size"}) instead of scoring every
// second hash as vLLM's coarser groups would allow.
func TestSGLangPageSizeMismatch(t *testing.T) {
	block := testnet.Block(t)
	sg := engineSpec{engine: enginesim.EngineSGLang, blockSize: 32}
	engines, zmq := startEngines(t, block, []engineSpec{sg, sg})
	tg := startGateway(t, block)
	id, base := createKVRule(t, tg, block+"1", engines, nil, map[string]any{
		"kvExactMode": 3, "kvEngineType": "sglang", "kvZmqPort": zmq, "kvBlockSize": 16,
	})
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)
	url := base + "/v1/completions"
	if r := post(t, url, map[string]any{"model": model, "prompt": preamble, "max_tokens": 2}); r.status != 200 {
		t.Fatalf("cold request: %d %s", r.status, r.body)
	}
	skips := func() float64 {
		return tg.metric(t, "kvgate_kv_skip_total", map[string]string{"service": svc, "cause": "block_size"})
	}
	var warm reply
	waitFor(t, "a block_size skip", 5*time.Second, func() bool {
		warm = post(t, url, map[string]any{"model": model, "prompt": preamble, "max_tokens": 2})
		return skips() > 0
	})
	if decisionField(warm.decision, "tier") == "1.5" || decisionField(warm.decision, "reason") != "hashes" {
		t.Fatalf("decision %q: want the fallback with reason hashes", warm.decision)
	}
	for _, e := range []string{"0", "1"} {
		if n := tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": e}); n != 0 {
			t.Fatalf("ep %s holds %v unmatchable blocks; want 0", e, n)
		}
	}
}

// TestSGLangDPRanksUnion: SGLang engines with two attention-DP ranks each
// (--dp-size 2, rank r publishing on kvZmqPort + r) behind a rule with
// kvDpRankCount 2. kvgate subscribes to both ranks of every endpoint and
// unions them: a prompt cached only by rank 1 of an endpoint (reached
// through SGLang's round robin) is a tier-1.5 hit on that endpoint.
func TestSGLangDPRanksUnion(t *testing.T) {
	block := testnet.Block(t)
	sg := engineSpec{engine: enginesim.EngineSGLang, blockSize: 16, dpSize: 2}
	engines, zmq := startEngines(t, block, []engineSpec{sg, sg})
	tg := startGateway(t, block)
	id, base := createKVRule(t, tg, block+"1", engines, nil, map[string]any{
		"kvExactMode": 3, "kvEngineType": "sglang", "kvZmqPort": zmq, "kvBlockSize": 16, "kvDpRankCount": 2,
	})
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)
	if n := tg.metric(t, "kvgate_kv_subscriber_rank_connected", map[string]string{"service": svc, "rank": "1"}); n != 2 {
		t.Fatalf("rank-1 subscribers connected = %v, want 2 (one per endpoint, on kvZmqPort+1)", n)
	}
	url := base + "/v1/completions"
	// Unrelated cold prompts until one lands on a rank 1 (round robin per
	// engine, so within a few requests).
	var prompt []int
	var ep, engine string
	for i := 0; i < 8 && ep == ""; i++ {
		p := tokenIDs(1000+100*i, 40) // two full pages, no prefix shared with another prompt
		r := postRank(t, url, map[string]any{"model": model, "prompt": p, "max_tokens": 2})
		if r.status != 200 {
			t.Fatalf("cold request %d: %d %s", i, r.status, r.body)
		}
		if decisionField(r.decision, "tier") != "3" {
			t.Fatalf("cold request %d: decision %q, want tier 3", i, r.decision)
		}
		if r.rank == "1" {
			prompt, ep, engine = p, decisionField(r.decision, "ep"), r.engine
		}
	}
	if ep == "" {
		t.Fatal("no cold request reached a rank 1")
	}
	hits := func() float64 { return tg.metric(t, "loxilb_pd_kv_tier15_hits_total", map[string]string{"ep_idx": ep}) }
	waitFor(t, "rank 1's pages in the inventory", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": ep}) > 0
	})
	before := hits()
	warm := postRank(t, url, map[string]any{"model": model, "prompt": append(prompt[:32:32], tokenIDs(9000, 5)...), "max_tokens": 2})
	if warm.status != 200 || decisionField(warm.decision, "tier") != "1.5" || decisionField(warm.decision, "ep") != ep || warm.engine != engine {
		t.Fatalf("warm request: %d decision %q engine %q; want tier 1.5 on ep %s (%s)", warm.status, warm.decision, warm.engine, ep, engine)
	}
	if d := hits() - before; d != 1 {
		t.Fatalf("tier15_hits_total{ep_idx=%s} rose by %v, want 1", ep, d)
	}
	assertLoadsZero(t, tg, id)
}

type rankReply struct {
	reply
	rank string
}

// postRank is post that also reads which attention-DP rank answered.
func postRank(t *testing.T, url string, body any) rankReply {
	t.Helper()
	var rank string
	r := postWith(t, url, body, func(h http.Header) { rank = h.Get("x-enginesim-dp-rank") })
	return rankReply{r, rank}
}

// TestGoNoGoGateTRTLLM is the §9 gate for kvEngineType trtllm on a
// single-pool rule over three TensorRT-LLM engines (enginesim --engine
// trtllm, 32-token blocks, no kvBlockSize or kvHashAlgo: the engine's
// defaults). kvgate drains each endpoint's POST /kv_cache_events on its
// targetPort: one poller per endpoint counts as its subscriber, the
// inventory fills after a cold request, a warm request sharing the prefix
// is one tier-1.5 hit on that endpoint, fallthrough stays flat, and the
// engine that answers reports the cached prefix.
func TestGoNoGoGateTRTLLM(t *testing.T) {
	block := testnet.Block(t)
	tr := engineSpec{engine: enginesim.EngineTRTLLM}
	engines, _ := startEngines(t, block, []engineSpec{tr, tr, tr})
	tg := startGateway(t, block)
	id, base := createKVRule(t, tg, block+"1", engines, nil, map[string]any{"kvExactMode": 3, "kvEngineType": "trtllm"})
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 3)
	url := base + "/v1/completions"

	cold := post(t, url, map[string]any{"model": model, "prompt": preamble + " Question: how do I drain a worker?", "max_tokens": 2})
	if cold.status != 200 || decisionField(cold.decision, "tier") != "3" {
		t.Fatalf("cold request: %d decision %q (want the rule selector, tier 3): %s", cold.status, cold.decision, cold.body)
	}
	ep := decisionField(cold.decision, "ep")
	waitFor(t, "loxilb_pd_kv_blocks > 0", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": ep}) > 0
	})
	hits := func() float64 { return tg.metric(t, "loxilb_pd_kv_tier15_hits_total", map[string]string{"ep_idx": ep}) }
	fall := func() float64 {
		return tg.metric(t, "loxilb_pd_kv_tier15_fallthrough_total", map[string]string{"service": svc})
	}
	hitsBefore, fallBefore := hits(), fall()
	warm := post(t, url, map[string]any{"model": model, "prompt": preamble + " Question: where are the logs?", "max_tokens": 2})
	if warm.status != 200 {
		t.Fatalf("warm request: %d %s", warm.status, warm.body)
	}
	if d := hits() - hitsBefore; d != 1 {
		t.Fatalf("tier15_hits_total{ep_idx=%s} rose by %v, want exactly 1 (decision %q)", ep, d, warm.decision)
	}
	if d := fall() - fallBefore; d != 0 {
		t.Fatalf("tier15_fallthrough_total rose by %v under warm traffic", d)
	}
	if decisionField(warm.decision, "tier") != "1.5" || decisionField(warm.decision, "ep") != ep || warm.engine != cold.engine {
		t.Fatalf("warm decision %q answered by %q; want tier 1.5 on ep %s, engine %q", warm.decision, warm.engine, ep, cold.engine)
	}
	if warm.cached() == 0 {
		t.Fatalf("the TensorRT-LLM engine reports no cached tokens for the warm request: %s", warm.body)
	}
	for i, e := range engines {
		if e.ID() == cold.engine {
			continue
		}
		if st, err := e.Stats(context.Background()); err != nil || st.CachedBlocks != 0 {
			t.Fatalf("engine %d holds %d blocks (err %v); it should never have seen the prompt", i, st.CachedBlocks, err)
		}
	}
	assertLoadsZero(t, tg, id)
}

// TestTRTLLMLoRATaskIDs: TensorRT-LLM keys an adapter's blocks by its
// lora_task_id. With kvLoraTaskIds mapping the adapter to the engines' task
// id, a warm adapter request is a tier-1.5 hit where the cold one went; an
// adapter the rule lists without a task id skips the tier by name (guard
// hashes, kvgate_kv_skip_total{cause="lora_task_id"}).
func TestTRTLLMLoRATaskIDs(t *testing.T) {
	block := testnet.Block(t)
	tr := engineSpec{engine: enginesim.EngineTRTLLM, lora: []string{"sql-lora", "doc-lora"},
		loraTaskIDs: map[string]uint64{"sql-lora": 7, "doc-lora": 9}}
	engines, _ := startEngines(t, block, []engineSpec{tr, tr})
	tg := startGateway(t, block)
	id, base := createKVRule(t, tg, block+"1", engines, nil, map[string]any{
		"kvExactMode": 3, "kvEngineType": "trtllm",
		"kvLoraAdapters": []string{"sql-lora=" + model, "doc-lora=" + model}, "kvLoraTaskIds": map[string]uint64{"sql-lora": 7},
	})
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)
	url := base + "/v1/completions"
	cold := post(t, url, map[string]any{"model": "sql-lora", "prompt": preamble + " Question: which table?", "max_tokens": 2})
	if cold.status != 200 {
		t.Fatalf("cold request: %d %s", cold.status, cold.body)
	}
	ep := decisionField(cold.decision, "ep")
	waitFor(t, "the adapter's blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": ep}) > 0
	})
	warm := post(t, url, map[string]any{"model": "sql-lora", "prompt": preamble + " Question: which index?", "max_tokens": 2})
	if warm.status != 200 || decisionField(warm.decision, "tier") != "1.5" || decisionField(warm.decision, "ep") != ep || warm.cached() == 0 {
		t.Fatalf("warm adapter request: %d decision %q cached %d; want a tier-1.5 hit on ep %s", warm.status, warm.decision, warm.cached(), ep)
	}
	skips := func() float64 {
		return tg.metric(t, "kvgate_kv_skip_total", map[string]string{"service": svc, "cause": "lora_task_id"})
	}
	before := skips()
	other := post(t, url, map[string]any{"model": "doc-lora", "prompt": preamble, "max_tokens": 2})
	if other.status != 200 || decisionField(other.decision, "reason") != "hashes" || skips()-before != 1 {
		t.Fatalf("adapter without a task id: %d decision %q, skips +%v; want reason hashes, one lora_task_id skip", other.status, other.decision, skips()-before)
	}
}

// TestPreflightReadsEngineBlockSizes: kvctl preflight's cache-config check
// reads each engine's own block size — SGLang's /get_server_info page_size,
// TensorRT-LLM's /server_info tokens_per_block — and its KV-event check sees
// the TensorRT-LLM drain; a rule whose kvBlockSize differs fails, naming it.
func TestPreflightReadsEngineBlockSizes(t *testing.T) {
	cases := []struct {
		name string
		spec engineSpec
		args map[string]any
		want string // the cache-config row's result
	}{
		{"sglang", engineSpec{engine: enginesim.EngineSGLang, blockSize: 16}, map[string]any{"kvEngineType": "sglang", "kvBlockSize": 16}, "pass"},
		{"sglang-mismatch", engineSpec{engine: enginesim.EngineSGLang, blockSize: 16}, map[string]any{"kvEngineType": "sglang", "kvBlockSize": 32}, "fail"},
		{"trtllm", engineSpec{engine: enginesim.EngineTRTLLM}, map[string]any{"kvEngineType": "trtllm"}, "pass"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			block := testnet.Block(t)
			engines, zmq := startEngines(t, block, []engineSpec{tc.spec})
			tg := startGateway(t, block)
			args := map[string]any{"kvExactMode": 3}
			if tc.spec.engine == enginesim.EngineSGLang {
				args["kvZmqPort"] = zmq
			}
			for k, v := range tc.args {
				args[k] = v
			}
			id, _ := createKVRule(t, tg, block+"1", engines, nil, args)
			tg.waitSubscribed(t, id, 1)
			resp, err := http.Post(fmt.Sprintf("%s/netlox/v1/config/ai/kv/preflight?service_id=%d&probe=0", tg.api, id), "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var rep struct {
				Checks []struct{ ID, Result, Detail, Fix string } `json:"checks"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			for _, c := range rep.Checks {
				seen[c.ID] = c.Result + ": " + c.Detail + " " + c.Fix
			}
			if got := seen["metrics"]; !strings.HasPrefix(got, tc.want+":") {
				t.Fatalf("cache-config row %q, want %s (all rows %v)", got, tc.want, seen)
			}
			if got := seen["kv_events"]; !strings.HasPrefix(got, "pass:") {
				t.Fatalf("KV-event row %q, want pass", got)
			}
		})
	}
}
