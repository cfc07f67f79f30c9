package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
)

// auditPrompt is a prompt of several 16-token blocks, unique per name. Its
// numbers tokenize differently under Qwen3 (one token per digit) and
// Llama 3 (up to three digits a token), so a wrong tokenizer miscounts it.
func auditPrompt(name string) string {
	return "Audit " + name + ": " + strings.Repeat("invoice 20260412 totals 98765.4321 over 31415926 units; ", 6)
}

// modelLabel is the model as kvgate's metrics spell it (characters outside
// [a-zA-Z0-9._-] become _).
const modelLabel = "Qwen_Qwen3-0.6B"

// auditCount reads kvgate_kv_usage_audit_total for the model and result.
func auditCount(t *testing.T, tg *testGateway, result string) float64 {
	t.Helper()
	return tg.metric(t, "kvgate_kv_usage_audit_total", map[string]string{"model": modelLabel, "result": result})
}

// cachedErrorExact reports how many cached-token errors were recorded, and
// how many of them were exactly 0 (the (-1, 0] bucket).
func cachedErrorExact(t *testing.T, tg *testGateway) (count, exact float64) {
	t.Helper()
	name := "kvgate_kv_cached_tokens_error_tokens_bucket"
	lbl := func(le string) map[string]string { return map[string]string{"model": modelLabel, "le": le} }
	return tg.metric(t, "kvgate_kv_cached_tokens_error_tokens_count", map[string]string{"model": modelLabel}),
		tg.metric(t, name, lbl("0")) - tg.metric(t, name, lbl("-1"))
}

// streamUsage sends a streamed completion with stream_options.include_usage
// and returns the body.
func streamUsage(t *testing.T, url, prompt string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	resp, err := http.Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), `"prompt_tokens"`) {
		t.Fatalf("stream %d %v: %s", resp.StatusCode, err, body)
	}
	return string(body)
}

// waitBlocks waits until the rule mirrors at least n blocks in total.
func waitBlocks(t *testing.T, tg *testGateway, id int, n float64) {
	t.Helper()
	waitFor(t, "mirrored blocks", 10*time.Second, func() bool {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": strconv.Itoa(id)}) >= n
	})
}

// TestUsageAudit runs the per-request usage audit against a real enginesim
// process and the gateway: a matched setup audits every response with no
// prompt-token mismatch and exact cached-token predictions; a wrong
// tokenizer staged for kvgate is counted as prompt-token mismatches under
// the model and logged; an engine without --enable-prompt-tokens-details is
// counted as no_details and preflight's usage row WARNs with the flag.
func TestUsageAudit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the enginesim binary")
	}
	enginesimBin, _ := preflightBins(t)
	cases := []struct {
		name        string
		args        []string
		wrongTok    bool    // stage Llama 3's tokenizer under the Qwen3 model
		wrongTmpl   bool    // stage Qwen3's tokenizer with a different chat template
		mismatches  float64 // prompt-token mismatches expected, of the 5 requests
		noDetails   bool
		exactCached bool // every cached-token prediction exact
	}{
		{name: "matched", exactCached: true},
		{name: "wrong-tokenizer", wrongTok: true, mismatches: 5},
		{name: "chat-template", wrongTmpl: true, mismatches: 1}, // only the chat request renders a template
		{name: "no-details", args: []string{"--enable-prompt-tokens-details=false"}, noDetails: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			block := testnet.Block(t)
			host := block + "11"
			httpPort, zmq := startEngineProcess(t, enginesimBin, host, []string{"PYTHONHASHSEED=0"}, tc.args...)
			staging := stagingDir(t)
			switch {
			case tc.wrongTok:
				staging = t.TempDir()
				llama, err := filepath.Abs("../../pkg/tokenizer/testdata/llama3")
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(llama, filepath.Join(staging, "Qwen__Qwen3-0.6B")); err != nil {
					t.Fatal(err)
				}
			case tc.wrongTmpl:
				staging = stageOtherTemplate(t)
			}
			tg, logs := startLoggedGateway(t, block, staging)
			vip := block + "1"
			port := testnet.Port(t, vip)
			rule, _ := json.Marshal(map[string]any{
				"serviceArguments": map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
					"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16, "kvWarmupSec": 0},
				"endpoints": []map[string]any{{"endpointIP": host, "targetPort": httpPort, "weight": 1}},
			})
			id := tg.createRule(t, rule)
			tg.waitSubscribed(t, id, 1)
			url := fmt.Sprintf("http://%s:%d/v1/completions", vip, port)

			prompt := auditPrompt(tc.name)
			first := post(t, url, map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
			if first.status != 200 {
				t.Fatalf("first request: %d %s", first.status, first.body)
			}
			if !tc.wrongTok {
				waitBlocks(t, tg, id, float64(first.usage.PromptTokens/16))
			} else {
				time.Sleep(300 * time.Millisecond) // kvgate's hashes never match; just let the events land
			}
			second := post(t, url, map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
			streamUsage(t, url, prompt)
			streamUsage(t, url, auditPrompt(tc.name+" stream")) // userspace gateway: every stream is read
			chatURL := fmt.Sprintf("http://%s:%d/v1/chat/completions", vip, port)
			if r := post(t, chatURL, map[string]any{"model": model, "max_tokens": 2,
				"messages": []map[string]any{{"role": "user", "content": auditPrompt(tc.name + " chat")}}}); r.status != 200 {
				t.Fatalf("chat: %d %s", r.status, r.body)
			}

			var found float64
			waitFor(t, "five audited responses", 5*time.Second, func() bool {
				found = auditCount(t, tg, "audited") + auditCount(t, tg, "no_details")
				return found == 5
			})
			mismatches := tg.metric(t, "kvgate_kv_prompt_tokens_mismatch_total", map[string]string{"model": modelLabel})
			count, exact := cachedErrorExact(t, tg)
			t.Logf("second request: cached %d of %d (decision %s); audited %v, mismatches %v, cached errors %v (%v exact)",
				second.cached(), second.usage.PromptTokens, second.decision, found, mismatches, count, exact)
			switch {
			case mismatches != tc.mismatches:
				t.Fatalf("%v prompt-token mismatches, want %v", mismatches, tc.mismatches)
			case tc.mismatches > 0:
				for _, want := range []string{"kv usage audit", "model=" + model, "kvgate_prompt_tokens=", "engine_prompt_tokens=", "first_diff_at_most="} {
					if !strings.Contains(logs.String(), want) {
						t.Fatalf("kvgate's log has no %q:\n%s", want, logs.String())
					}
				}
				t.Logf("log: %s", grepLine(logs.String(), "kv usage audit"))
				checkStatusProblem(t, tg, id, "prompt_tokens_mismatch")
				// Rate-limited: one line per 10 s, however many requests mismatch.
				if n := strings.Count(logs.String(), "kv usage audit"); tc.mismatches > 1 && n >= int(tc.mismatches) {
					t.Fatalf("%d mismatch lines for %v mismatches: not rate-limited", n, tc.mismatches)
				}
			}
			if tc.noDetails {
				if n := auditCount(t, tg, "no_details"); n != 5 || count != 0 {
					t.Fatalf("no_details %v (want 5), cached errors %v (want 0)", n, count)
				}
				checkUsageRowWarns(t, tg, id)
				return
			}
			if count != 5 {
				t.Fatalf("%v cached-token errors recorded, want 5", count)
			}
			if tc.exactCached && (exact != 5 || second.cached() == 0) {
				t.Fatalf("%v of 5 cached-token predictions exact (second request cached %d)", exact, second.cached())
			}
		})
	}
}

// stageOtherTemplate stages Qwen3's tokenizer with a chat template that
// adds a line the engine's does not: completions still count alike, chat
// prompts do not.
func stageOtherTemplate(t *testing.T) string {
	t.Helper()
	src := repoTokenizerDir(t)
	dir := filepath.Join(t.TempDir(), "Qwen__Qwen3-0.6B")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(src, "tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = "{{- 'Reply briefly.\\n' }}" + cfg["chat_template"].(string)
	out, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(dir)
}

// checkStatusProblem wants the status view to list a problem of kind for
// the rule.
func checkStatusProblem(t *testing.T, tg *testGateway, id int, kind string) {
	t.Helper()
	resp, err := http.Get(tg.api + "/netlox/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Problems []struct {
			ServiceID int    `json:"service_id"`
			Kind      string `json:"kind"`
			Detail    string `json:"detail"`
		} `json:"problems"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Problems {
		if p.ServiceID == id && p.Kind == kind {
			t.Logf("status problem: %s: %s", p.Kind, p.Detail)
			return
		}
	}
	t.Fatalf("no %s problem for rule %d in %+v", kind, id, st.Problems)
}

// checkUsageRowWarns runs the preflight through the API and wants its usage
// row to WARN with the flag to set.
func checkUsageRowWarns(t *testing.T, tg *testGateway, id int) {
	t.Helper()
	resp, err := http.Post(tg.api+"/netlox/v1/config/ai/kv/preflight?service_id="+strconv.Itoa(id), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep struct {
		Checks []struct {
			ID, Result, Detail, Fix string
		} `json:"checks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.ID == "usage" {
			t.Logf("usage row: %s %s (fix: %s)", c.Result, c.Detail, c.Fix)
			if c.Result != "warn" || !strings.Contains(c.Fix, "--enable-prompt-tokens-details") {
				t.Fatalf("usage row %+v, want a WARN naming --enable-prompt-tokens-details", c)
			}
			return
		}
	}
	t.Fatalf("no usage row in %+v", rep.Checks)
}

// TestUsageAuditSampling: on the sockmap data path, LLB_KV_AUDIT_SAMPLE=1
// copies every token stream in userspace and audits it; =0 audits none and
// leaves them to the kernel leg. Non-streamed responses are audited either
// way.
func TestUsageAuditSampling(t *testing.T) {
	for _, tc := range []struct {
		sample  int
		streams float64 // audited streams
	}{{1, 3}, {0, 0}} {
		t.Run("sample"+strconv.Itoa(tc.sample), func(t *testing.T) {
			block := testnet.Block(t)
			engines, zmq := startEngines(t, block, []engineSpec{{decodeTS: 200}})
			tg, err := tryStartGateway(t, block, "2", "sockmap", func(s *config.Settings) { s.AuditSample = tc.sample })
			if err != nil {
				if os.Getenv("KVGATE_REQUIRE_BPF") != "1" {
					t.Skipf("sockmap data path unavailable here: %v", err)
				}
				t.Fatal(err)
			}
			id, base := createKVRule(t, tg, block+"1", engines, nil,
				map[string]any{"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16})
			tg.waitSubscribed(t, id, 1)
			for i := range 3 {
				streamUsage(t, base+"/v1/completions", auditPrompt(fmt.Sprintf("sampling %d %d", tc.sample, i)))
			}
			if r := post(t, base+"/v1/completions", map[string]any{"model": model, "prompt": auditPrompt("json"), "max_tokens": 2}); r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			waitFor(t, "the non-streamed response audited", 5*time.Second, func() bool {
				return tg.metric(t, "kvgate_kv_usage_audit_total", map[string]string{"model": modelLabel}) == tc.streams+1
			})
			paths := map[string]int{}
			for _, rec := range accessRecords(tg.access) {
				paths[fmt.Sprint(rec["datapath"])]++
			}
			t.Logf("data paths %v", paths)
			if tc.sample == 0 && paths["sockmap"] < 1 {
				t.Fatalf("with LLB_KV_AUDIT_SAMPLE=0 no stream was spliced: %v", paths)
			}
			if tc.sample == 1 && paths["sockmap"] != 0 {
				t.Fatalf("with LLB_KV_AUDIT_SAMPLE=1 a stream was spliced unaudited: %v", paths)
			}
			if n := tg.metric(t, "kvgate_kv_prompt_tokens_mismatch_total", nil); n != 0 {
				t.Fatalf("%v prompt-token mismatches", n)
			}
		})
	}
}

// TestUsageAuditPD: a P/D rule audits the prefill leg's usage: one audit per
// request (the decode's relayed stream is not read again), with the cached
// tokens the prefill reported against the overlap predicted on it.
func TestUsageAuditPD(t *testing.T) {
	_, tg, id, url := startPD(t, pdTopology(), nil, map[string]any{"kvWarmupSec": 0})
	tg.waitSubscribed(t, id, 2)
	prompt := auditPrompt("pd")
	first := post(t, url, map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
	if first.status != 200 {
		t.Fatalf("%d %s", first.status, first.body)
	}
	waitBlocks(t, tg, id, float64(first.usage.PromptTokens/16))
	streamUsage(t, url, prompt)
	waitFor(t, "two audits", 5*time.Second, func() bool { return auditCount(t, tg, "audited") >= 2 })
	time.Sleep(200 * time.Millisecond) // a decode-leg audit, if any, would land by now
	count, exact := cachedErrorExact(t, tg)
	if n := tg.metric(t, "kvgate_kv_usage_audit_total", nil); n != 2 || count != 2 || exact != 2 {
		t.Fatalf("%v audits, %v cached errors (%v exact); want 2 exact, from the prefill legs", n, count, exact)
	}
	if n := tg.metric(t, "kvgate_kv_prompt_tokens_mismatch_total", nil); n != 0 {
		t.Fatalf("%v prompt-token mismatches", n)
	}
}

// grepLine returns the first line of s containing sub.
func grepLine(s, sub string) string {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			return line
		}
	}
	return ""
}

// TestUsageAuditConversationAPIs: /v1/responses and /v1/messages are
// audited from their own usage shapes: the Responses API's input_tokens and
// input_tokens_details.cached_tokens (compared, exact on the warm repeat),
// the Messages API's input_tokens (compared; no cached count: no_details).
func TestUsageAuditConversationAPIs(t *testing.T) {
	_, tg, id, base := startMode3(t, []engineSpec{{}}, map[string]any{"kvWarmupSec": 0})
	blocks := func() float64 {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": strconv.Itoa(id)})
	}
	tests := []struct {
		path   string
		body   map[string]any
		result string
	}{
		{"/v1/responses", map[string]any{"model": model, "max_output_tokens": 4, "instructions": auditPrompt("responses"),
			"input": "Where are the logs?"}, "audited"},
		{"/v1/messages", map[string]any{"model": model, "max_tokens": 4, "system": auditPrompt("messages"),
			"messages": []any{map[string]any{"role": "user", "content": "Where are the logs?"}}}, "no_details"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			before, stored := auditCount(t, tg, tc.result), blocks()
			for i := range 2 {
				r := post(t, base+tc.path, tc.body)
				if r.status != 200 {
					t.Fatalf("request %d: %d %s", i, r.status, r.body)
				}
				if i == 0 { // the repeat is predicted from all of the first request's blocks
					var u struct {
						Usage struct {
							InputTokens int `json:"input_tokens"`
						} `json:"usage"`
					}
					if err := json.Unmarshal(r.body, &u); err != nil || u.Usage.InputTokens < 48 {
						t.Fatalf("usage %+v (%v): %s", u, err, r.body)
					}
					want := stored + float64(u.Usage.InputTokens/16)
					waitFor(t, "the first request's blocks", 10*time.Second, func() bool { return blocks() >= want })
				}
			}
			waitFor(t, "two audits of "+tc.path, 5*time.Second, func() bool { return auditCount(t, tg, tc.result)-before == 2 })
		})
	}
	count, exact := cachedErrorExact(t, tg)
	if n := tg.metric(t, "kvgate_kv_prompt_tokens_mismatch_total", nil); n != 0 || count != 2 || exact != 2 {
		t.Fatalf("%v prompt-token mismatches, %v cached errors (%v exact); want 0 and 2 exact (the Responses API's)", n, count, exact)
	}
}
