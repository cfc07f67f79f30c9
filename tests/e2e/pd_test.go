package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
)

// The worked example's prompts (docs/pd.md): a 32-token preamble (two full blocks) plus a question.
var (
	pdPreamble = tokenIDs(1000, 32)
	pdPromptA  = append(append([]int{}, pdPreamble...), tokenIDs(5000, 8)...) // 40 tokens: B1, B2, partial B3
	pdPromptB  = append(append([]int{}, pdPreamble...), tokenIDs(7000, 6)...) // 38 tokens: B1, B2, partial B3'
)

// TestPDWorkedExampleMode1 is docs/pd.md's worked example on a mode-1 rule:
// EP0 and EP2 prefill, EP1 decode. The cold request goes to Tier 2, the
// warm one to the prefill engine holding the preamble (tier15_hits for its
// ep_idx, score 2); decode always runs on EP1, which reports the prefill as
// skipped (its prompt tokens came from the prefill engine, not computed
// locally); the client sees the prefill's cached tokens.
func TestPDWorkedExampleMode1(t *testing.T) {
	engines, tg, id, url := startPD(t, pdTopology(), nil, nil)
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)

	cold := post(t, url, map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 4})
	if cold.status != 200 {
		t.Fatalf("cold request: %d %s", cold.status, cold.body)
	}
	// The decode engine took the prompt from the prefill engine: every token
	// before the last (which vLLM recomputes) counts as an external hit.
	if ext := engineMetric(t, engines[1], "vllm:external_prefix_cache_hits_total"); ext != float64(len(pdPromptA)-1) {
		t.Fatalf("decode external prefix hits %v after the cold request, want %d", ext, len(pdPromptA)-1)
	}
	if decisionField(cold.decision, "tier") != "2" || decisionField(cold.decision, "reason") != "no_worker" {
		t.Fatalf("cold request decision %q, want tier 2 (no_worker)", cold.decision)
	}
	coldEP := decisionField(cold.decision, "ep")
	if coldEP != "0" && coldEP != "2" {
		t.Fatalf("cold prefill on ep %s, want a prefill endpoint", coldEP)
	}
	if decisionField(cold.decision, "decode") != "1" || cold.engine != "engine-1" {
		t.Fatalf("cold decode: decision %q, delivered by %q; want EP1", cold.decision, cold.engine)
	}
	waitFor(t, "the cold prefill engine's blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": coldEP}) >= 2
	})

	hits := func() float64 {
		return tg.metric(t, "loxilb_pd_kv_tier15_hits_total", map[string]string{"service": svc, "ep_idx": coldEP})
	}
	before := hits()
	extBefore := engineMetric(t, engines[1], "vllm:external_prefix_cache_hits_total")
	warm := post(t, url, map[string]any{"model": model, "prompt": pdPromptB, "max_tokens": 4})
	if warm.status != 200 {
		t.Fatalf("warm request: %d %s", warm.status, warm.body)
	}
	want := fmt.Sprintf("tier=1.5; ep=%s; score=2; reason=hit; decode=1", coldEP)
	if warm.decision != want || warm.engine != "engine-1" {
		t.Fatalf("warm request: decision %q delivered by %q; want %q by engine-1", warm.decision, warm.engine, want)
	}
	if d := hits() - before; d != 1 {
		t.Fatalf("tier15_hits_total{ep_idx=%s} rose by %v, want 1", coldEP, d)
	}
	if warm.cached() != 32 {
		t.Fatalf("client sees %d cached tokens, want the prefill engine's 32 (B1, B2)", warm.cached())
	}
	// Warm: the decode engine holds B1, B2 itself now; the rest of the
	// prompt but its last token comes from the prefill engine, and it never
	// prefilled locally.
	if ext := engineMetric(t, engines[1], "vllm:external_prefix_cache_hits_total") - extBefore; ext != float64(len(pdPromptB)-1-32) {
		t.Fatalf("decode external prefix hits rose by %v, want %d", ext, len(pdPromptB)-1-32)
	}
	if n := engineMetric(t, engines[1], "enginesim_decode_local_prefills_total"); n != 0 {
		t.Fatalf("decode engine prefilled %v requests locally", n)
	}
	if n := tg.metric(t, "loxilb_ai_pd_kv_params_found_total", nil); n != 2 {
		t.Fatalf("kv_params_found_total = %v, want 2", n)
	}
	assertLoadsZero(t, tg, id)
}

// TestPDPrefillKilled: the prefill engine holding the preamble is killed.
// The next warm request is refused by it, retried with it excluded and
// served by the other prefill engine (connect failover); once the probe has
// marked it down it is no longer tried at all.
func TestPDPrefillKilled(t *testing.T) {
	engines, tg, id, url := startPD(t, pdTopology(), nil, nil)
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)

	cold := post(t, url, map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 2})
	if cold.status != 200 {
		t.Fatalf("cold: %d %s", cold.status, cold.body)
	}
	holder := decisionField(cold.decision, "ep")
	other := "2"
	if holder == "2" {
		other = "0"
	}
	waitFor(t, "blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": holder}) >= 2
	})
	hi, _ := strconv.Atoi(holder)
	engines[hi].Close()

	failover := func() float64 {
		return tg.metric(t, "loxilb_pd_connect_failover_total", map[string]string{"service": svc})
	}
	f0 := failover()
	warm := post(t, url, map[string]any{"model": model, "prompt": pdPromptB, "max_tokens": 2})
	if warm.status != 200 || decisionField(warm.decision, "ep") != other || warm.engine != "engine-1" {
		t.Fatalf("warm after kill: %d decision %q engine %q %s; want prefill ep %s", warm.status, warm.decision, warm.engine, warm.body, other)
	}
	if d := failover() - f0; d != 1 {
		t.Fatalf("connect failover rose by %v, want 1", d)
	}

	waitFor(t, "the probe to mark the killed engine down", 10*time.Second, func() bool {
		return tg.metric(t, "kvgate_endpoint_probe_transitions_total", map[string]string{"service": svc, "ep_idx": holder, "to": "down"}) == 1
	})
	f1 := failover()
	again := post(t, url, map[string]any{"model": model, "prompt": pdPromptB, "max_tokens": 2})
	if again.status != 200 || decisionField(again.decision, "ep") != other {
		t.Fatalf("after probe-down: %d decision %q", again.status, again.decision)
	}
	if failover() != f1 {
		t.Fatal("a probe-down endpoint was still tried")
	}
	assertLoadsZero(t, tg, id)
}

// TestPDPrefillTimeout: a prefill slower than LLB_PD_PREFILL_TIMEOUT_SEC is
// answered 504 pd_prefill_timeout within the timeout + 1 s.
func TestPDPrefillTimeout(t *testing.T) {
	slow := pdTopology()
	slow[0].prefillUsPerToken, slow[2].prefillUsPerToken = 200_000, 200_000 // 40 tokens ≈ 8 s
	const timeout = time.Second
	_, tg, id, url := startPD(t, slow, func(s *config.Settings) { s.PrefillTimeout = timeout }, nil)
	start := time.Now()
	r := post(t, url, map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 2})
	el := time.Since(start)
	if r.status != 504 || errorCode(r.body) != "pd_prefill_timeout" {
		t.Fatalf("answer %d %s, want 504 pd_prefill_timeout", r.status, r.body)
	}
	if el > timeout+time.Second {
		t.Fatalf("answered after %v, want within %v", el, timeout+time.Second)
	}
	if n := tg.metric(t, "kvgate_pd_timeouts_total", map[string]string{"service": strconv.Itoa(id), "kind": "pd_prefill_timeout"}); n != 1 {
		t.Fatalf("pd_prefill_timeout counted %v times", n)
	}
	if n := tg.metric(t, "loxilb_ai_pd_requests_total", map[string]string{"phase": "prefill", "status": "timeout"}); n != 1 {
		t.Fatalf("ai_pd_requests_total{prefill,timeout} = %v", n)
	}
	assertLoadsZero(t, tg, id)
}

// TestPDAllPrefillDown: with every prefill engine down the plain request
// goes to the decode engine (LLB_PD_DECODE_ONLY_FALLBACK=1, the default),
// or the client gets 503 pd_pool_unavailable (=0).
func TestPDAllPrefillDown(t *testing.T) {
	block := testnet.Block(t)
	engines, zmq := startEngines(t, block, pdTopology())
	on := startPDGateway(t, block, "2", nil)
	off := startPDGateway(t, block, "3", func(s *config.Settings) { s.DecodeOnlyFallback = false })
	idOn, urlOn := pdRule(t, on, block, "1", engines, zmq, nil)
	idOff, urlOff := pdRule(t, off, block, "4", engines, zmq, nil)
	engines[0].Close()
	engines[2].Close()

	r := post(t, urlOn, map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 2})
	if r.status != 200 || r.engine != "engine-1" || decisionField(r.decision, "tier") != "decode_only" {
		t.Fatalf("fallback on: %d engine %q decision %q %s", r.status, r.engine, r.decision, r.body)
	}
	if n := on.metric(t, "loxilb_pd_fallback_to_normal_total", map[string]string{"service": strconv.Itoa(idOn)}); n != 1 {
		t.Fatalf("fallback counted %v", n)
	}
	if n := engineMetric(t, engines[1], "enginesim_decode_local_prefills_total"); n != 1 {
		t.Fatalf("decode engine local prefills %v, want 1 (the plain request)", n)
	}
	r = post(t, urlOff, map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 2})
	if r.status != 503 || errorCode(r.body) != "pd_pool_unavailable" {
		t.Fatalf("fallback off: %d %s, want 503 pd_pool_unavailable", r.status, r.body)
	}
	// Once the probes have marked both down the answers stay the same.
	waitFor(t, "probe-down", 10*time.Second, func() bool {
		return off.metric(t, "kvgate_endpoint_probe_up", map[string]string{"service": strconv.Itoa(idOff), "ep_idx": "0"}) == 0 &&
			off.metric(t, "kvgate_endpoint_probe_up", map[string]string{"service": strconv.Itoa(idOff), "ep_idx": "2"}) == 0
	})
	r = post(t, urlOff, map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 2})
	if r.status != 503 || errorCode(r.body) != "pd_pool_unavailable" {
		t.Fatalf("fallback off, probe-down: %d %s", r.status, r.body)
	}
	assertLoadsZero(t, on, idOn)
	assertLoadsZero(t, off, idOff)
}

// TestPDDecodeKilledMidStream: the decode engine dies while streaming; the
// client sees the stream end (not a hang) and the in-flight counts return
// to 0.
func TestPDDecodeKilledMidStream(t *testing.T) {
	topo := pdTopology()
	topo[1].decodeTS = 20 // 200 tokens take 10 s
	engines, tg, id, url := startPD(t, topo, nil, nil)

	b, _ := json.Marshal(map[string]any{"model": model, "prompt": pdPromptA, "max_tokens": 200, "stream": true})
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-engine-id") != "engine-1" {
		t.Fatalf("stream: %d from %q", resp.StatusCode, resp.Header.Get("x-engine-id"))
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	loads, _ := tg.g.Loads(id)
	if loads.Total() != 2 {
		t.Fatalf("in flight during the stream = %d, want 2 (prefill and decode endpoint)", loads.Total())
	}
	killed := time.Now()
	engines[1].Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the client stream did not end after the decode engine died")
	}
	t.Logf("stream ended %v after the kill", time.Since(killed))
	assertLoadsZero(t, tg, id)
}

// TestPDAdmissionCap: with LLB_PD_MAX_INFLIGHT_PER_EP=1 and both prefill
// engines busy, the next request gets 429 pd_overloaded with Retry-After: 1.
func TestPDAdmissionCap(t *testing.T) {
	slow := pdTopology()
	slow[0].prefillUsPerToken, slow[2].prefillUsPerToken = 50_000, 50_000 // 40 tokens ≈ 2 s
	_, tg, id, url := startPD(t, slow, func(s *config.Settings) { s.MaxInflightPerEP = 1 }, nil)
	svc := strconv.Itoa(id)

	done := make(chan reply, 2)
	for i := 0; i < 2; i++ {
		go func(i int) {
			done <- post(t, url, map[string]any{"model": model, "prompt": append(tokenIDs(9000+100*i, 8), pdPromptA...), "max_tokens": 2})
		}(i)
	}
	loads, _ := tg.g.Loads(id)
	waitFor(t, "both prefill endpoints busy", 5*time.Second, func() bool { return loads.Load(0) == 1 && loads.Load(2) == 1 })
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": pdPromptB, "max_tokens": 2})
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || errorCode(body) != "pd_overloaded" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("answer %d %v %s; want 429 pd_overloaded with Retry-After: 1", resp.StatusCode, resp.Header, body)
	}
	if !strings.Contains(string(body), `"detail"`) {
		t.Fatalf("error body without detail: %s", body)
	}
	if n := tg.metric(t, "loxilb_pd_admission_shed_total", map[string]string{"service": svc}); n != 1 {
		t.Fatalf("admission_shed_total = %v", n)
	}
	for i := 0; i < 2; i++ {
		if r := <-done; r.status != 200 {
			t.Fatalf("admitted request: %d %s", r.status, r.body)
		}
	}
	assertLoadsZero(t, tg, id)
}

// TestPDAdminDown: an endpoint set admin down through the management API
// (what `kvctl set endpoint --admin=down` sends) keeps its inventory but is
// never selected; set up again, it wins its overlap back.
func TestPDAdminDown(t *testing.T) {
	engines, tg, id, url := startPD(t, pdTopology(), nil, nil)
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)

	promptA3 := append(append([]int{}, pdPreamble...), tokenIDs(5000, 16)...) // three full blocks
	cold := post(t, url, map[string]any{"model": model, "prompt": promptA3, "max_tokens": 2})
	holder := decisionField(cold.decision, "ep")
	waitFor(t, "blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": holder}) >= 3
	})
	hi, _ := strconv.Atoi(holder)
	host, port := engineHostPort(t, engines[hi])
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	vip, vport := u.Hostname(), u.Port()
	setAdmin := func(state string) {
		body := fmt.Sprintf(`{"endpointIP":%q,"targetPort":%d,"admin":%q}`, host, port, state)
		req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%s/protocol/tcp/endpoint", tg.api, vip, vport), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("set admin %s: %d %s", state, resp.StatusCode, b)
		}
	}
	setAdmin("down")
	failover := tg.metric(t, "loxilb_pd_connect_failover_total", map[string]string{"service": svc})
	warm := post(t, url, map[string]any{"model": model, "prompt": pdPromptB, "max_tokens": 2})
	if warm.status != 200 || decisionField(warm.decision, "ep") == holder {
		t.Fatalf("admin-down endpoint selected: %d %q", warm.status, warm.decision)
	}
	if tg.metric(t, "loxilb_pd_connect_failover_total", map[string]string{"service": svc}) != failover {
		t.Fatal("the admin-down endpoint was tried")
	}
	if n := tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": holder}); n < 2 {
		t.Fatalf("admin-down endpoint lost its inventory (%v blocks)", n)
	}
	setAdmin("up")
	// The holder has all three blocks of its prompt, the other endpoint two:
	// the holder wins its overlap back.
	again := post(t, url, map[string]any{"model": model, "prompt": promptA3, "max_tokens": 2})
	if again.status != 200 || decisionField(again.decision, "ep") != holder || decisionField(again.decision, "tier") != "1.5" {
		t.Fatalf("after admin up: %d %q, want tier 1.5 on ep %s", again.status, again.decision, holder)
	}
	assertLoadsZero(t, tg, id)
}

// TestPDBreakerOpens: with probes off (probetype none) only the circuit
// breaker notices a dead prefill engine: three consecutive connect failures
// (the P/D threshold) open it (loxilb_pd_cb_flips_total), after which the
// endpoint is no longer tried even for prompts only it holds.
func TestPDBreakerOpens(t *testing.T) {
	engines, tg, id, url := startPD(t, pdTopology(), nil, map[string]any{"probetype": "none"})
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)

	// Cold prompts with distinct 3-block prefixes until four sit on EP0.
	var onEP0 [][]int
	for i := 0; len(onEP0) < 4 && i < 16; i++ {
		p := tokenIDs(20000+1000*i, 48)
		r := post(t, url, map[string]any{"model": model, "prompt": p, "max_tokens": 2})
		if r.status != 200 {
			t.Fatalf("cold %d: %d %s", i, r.status, r.body)
		}
		if decisionField(r.decision, "ep") == "0" {
			onEP0 = append(onEP0, p)
		}
	}
	if len(onEP0) < 4 {
		t.Fatalf("only %d cold prompts landed on EP0", len(onEP0))
	}
	waitFor(t, "EP0's blocks", 5*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": "0"}) >= 12
	})
	engines[0].Close()
	failover := func() float64 {
		return tg.metric(t, "loxilb_pd_connect_failover_total", map[string]string{"service": svc})
	}
	for i := 0; i < 3; i++ {
		f := failover()
		r := post(t, url, map[string]any{"model": model, "prompt": onEP0[i], "max_tokens": 2})
		if r.status != 200 || decisionField(r.decision, "ep") != "2" || failover()-f != 1 {
			t.Fatalf("request %d: %d %q, failover +%v", i, r.status, r.decision, failover()-f)
		}
	}
	if n := tg.metric(t, "loxilb_pd_cb_flips_total", map[string]string{"service": svc, "ep_idx": "0"}); n != 1 {
		t.Fatalf("cb_flips_total{ep_idx=0} = %v, want 1 (opened)", n)
	}
	f := failover()
	r := post(t, url, map[string]any{"model": model, "prompt": onEP0[3], "max_tokens": 2})
	if r.status != 200 || decisionField(r.decision, "ep") != "2" || failover() != f {
		t.Fatalf("with the breaker open: %d %q, failover +%v", r.status, r.decision, failover()-f)
	}
	assertLoadsZero(t, tg, id)
}

// TestPDChatStream: a streamed chat request with max_completion_tokens,
// min_tokens and stream_options takes both legs: the prefill engine accepts
// the rewrite (vLLM rejects stream_options without stream, and min_tokens
// above max_tokens) and the decode engine streams with the prompt's KV from
// the prefill.
func TestPDChatStream(t *testing.T) {
	engines, tg, id, u := startPD(t, pdTopology(), nil, nil)
	url := strings.Replace(u, "/v1/completions", "/v1/chat/completions", 1)
	b, _ := json.Marshal(map[string]any{"model": model, "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_completion_tokens": 6, "min_tokens": 3,
		"messages": []map[string]any{{"role": "system", "content": preamble}, {"role": "user", "content": "Where are the logs?"}}})
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-engine-id") != "engine-1" || !strings.Contains(string(body), "data: [DONE]") {
		t.Fatalf("chat stream: %d from %q: %s", resp.StatusCode, resp.Header.Get("x-engine-id"), body)
	}
	if n := engineMetric(t, engines[1], "enginesim_decode_local_prefills_total"); n != 0 {
		t.Fatalf("decode engine prefilled locally (%v): the hand-off did not happen", n)
	}
	if n := engineMetric(t, engines[1], "vllm:external_prefix_cache_hits_total"); n == 0 {
		t.Fatal("decode engine took no tokens from the prefill engine")
	}
	assertLoadsZero(t, tg, id)
}
