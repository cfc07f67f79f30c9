package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
)

// TestGrowingConversationIncremental sends a long conversation that grows
// by a turn per request through the daemon to a real enginesim process:
// kvgate reuses the decoded messages and the ids of each earlier turn (the
// decoded-message and conversation caches report hits) and its prompt-token and cached-token predictions
// still equal the engine's usage on every request (docs/tokenizer.md,
// "Decision cost at long context").
func TestGrowingConversationIncremental(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the enginesim binary")
	}
	enginesimBin, _ := preflightBins(t)
	block := testnet.Block(t)
	host := block + "11"
	httpPort, zmq := startEngineProcess(t, enginesimBin, host, []string{"PYTHONHASHSEED=0"})
	tg, _ := startLoggedGateway(t, block, stagingDir(t))
	vip := block + "1"
	port := testnet.Port(t, vip)
	rule, _ := json.Marshal(map[string]any{
		"serviceArguments": map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
			"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16, "kvWarmupSec": 0},
		"endpoints": []map[string]any{{"endpointIP": host, "targetPort": httpPort, "weight": 1}},
	})
	id := tg.createRule(t, rule)
	tg.waitSubscribed(t, id, 1)
	url := fmt.Sprintf("http://%s:%d/v1/chat/completions", vip, port)

	turn := func(i int) string {
		return fmt.Sprintf("Turn %d: ", i) + strings.Repeat(fmt.Sprintf("ledger %d balances 4512.%02d across 17 accounts; ", i, i), 60)
	}
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You audit ledgers line by line. ", 300)}}
	const turns = 4
	for i := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": turn(i)})
		r := post(t, url, map[string]any{"model": model, "messages": msgs, "max_tokens": 2})
		if r.status != 200 {
			t.Fatalf("turn %d: %d %s", i, r.status, r.body)
		}
		waitBlocks(t, tg, id, float64(r.usage.PromptTokens/16))
		t.Logf("turn %d: %d prompt tokens, %d cached (decision %s)", i, r.usage.PromptTokens, r.cached(), r.decision)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprintf("Checked ledger %d.", i)})
	}
	waitFor(t, "audited responses", 5*time.Second, func() bool { return auditCount(t, tg, "audited") == turns })
	if n := tg.metric(t, "kvgate_kv_prompt_tokens_mismatch_total", map[string]string{"model": modelLabel}); n != 0 {
		t.Fatalf("%v prompt-token mismatches: incremental ids differ from the engine's", n)
	}
	if count, exact := cachedErrorExact(t, tg); count != turns || exact != turns {
		t.Fatalf("%v of %v cached-token predictions exact", exact, count)
	}
	hits := tg.metric(t, "kvgate_tokenize_prefix_lookups_total", map[string]string{"result": "hit"})
	misses := tg.metric(t, "kvgate_tokenize_prefix_lookups_total", map[string]string{"result": "miss"})
	if hits < turns-1 || tg.metric(t, "kvgate_tokenize_prefix_reused_bytes_total", nil) == 0 || tg.metric(t, "kvgate_tokenize_prefix_cache_bytes", nil) == 0 {
		t.Fatalf("conversation cache: %v hits, %v misses; want a hit on every turn after the first", hits, misses)
	}
	// The rule's decoded-message cache reused each earlier turn's messages
	// too, and the ids above were still exact.
	if n := tg.metric(t, "kvgate_extract_messages_lookups_total", map[string]string{"result": "hit"}); n < turns-1 || tg.metric(t, "kvgate_extract_messages_reused_bytes_total", nil) == 0 {
		t.Fatalf("decoded-message cache: %v hits; want a hit on every turn after the first", n)
	}
	if n := tg.metric(t, "kvgate_extract_messages_cache_bytes", nil); n == 0 {
		t.Fatal("kvgate_extract_messages_cache_bytes is 0 with the last turn's messages cached")
	}
}
