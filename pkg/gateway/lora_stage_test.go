package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

const baseModel = "Qwen/Qwen3-0.6B"

// stagedQwen3 stages the repository's Qwen3 tokenizer under the base model's slug.
func stagedQwen3(t testing.TB) string {
	t.Helper()
	src, err := filepath.Abs("../tokenizer/testdata/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(src, filepath.Join(dir, tokenizer.Slug(baseModel))); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLoraAdapterFacts: a request whose model names one of the rule's
// kvLoraAdapters is tokenized with the base model's tokenizer and hashed with
// the adapter name in the extra keys (vLLM's lora_name on every block); the
// same prompt for the base model hashes without it; a bare adapter name with
// no tokenizer staged under it is a tokenize miss.
func TestLoraAdapterFacts(t *testing.T) {
	rule := mustRule(t, `{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3,
		"kvLoraAdapters":["sql-lora=Qwen/Qwen3-0.6B","bare-lora"]},"endpoints":[{"endpointIP":"127.0.0.1","targetPort":10}]}`)
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
	pool := tokenizer.NewPool(stagedQwen3(t))
	r := &router{service: 1, sel: sel, opts: selector.DefaultOptions(), pool: pool, log: quietLogger()}
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)
	m, err := pool.Get(baseModel)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m.EncodePrompt(prompt, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := func(lora string) []uint64 { return st.hasher.AppendHashes(nil, ids, kvhash.Extra{LoRAName: lora}) }

	prep := func(model string) *plan {
		req := &fullproxy.Request{Target: "/v1/completions", BodyInspected: true, RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1},
			Body: fmt.Appendf(nil, `{"model":%q,"prompt":%q}`, model, prompt)}
		return r.prepare(st, req)
	}
	base := prep(baseModel)
	if base.facts.LoRA != "" || !slices.Equal(base.selReq.Hashes, want("")) || len(base.selReq.Hashes) == 0 {
		t.Fatalf("base model: lora %q, %d hashes, want %d plain hashes", base.facts.LoRA, len(base.selReq.Hashes), len(want("")))
	}
	lora := prep("sql-lora")
	if lora.facts.LoRA != "sql-lora" {
		t.Fatalf("adapter request: facts.LoRA = %q", lora.facts.LoRA)
	}
	if !slices.Equal(lora.selReq.Hashes, want("sql-lora")) {
		t.Fatalf("adapter hashes differ from base-tokenizer ids hashed with lora_name")
	}
	for i := range lora.selReq.Hashes {
		if lora.selReq.Hashes[i] == base.selReq.Hashes[i] {
			t.Fatalf("block %d: adapter and base model hash alike", i)
		}
	}
	if bare := prep("bare-lora"); bare.facts.LoRA != "bare-lora" || bare.selReq.Upstream != selector.ReasonTokenize {
		t.Fatalf("bare adapter without a staged tokenizer: lora %q upstream %v, want a tokenize miss", bare.facts.LoRA, bare.selReq.Upstream)
	}
	if other := prep("not-listed"); other.facts.LoRA != "" {
		t.Fatalf("a model that is not a listed adapter set LoRA %q", other.facts.LoRA)
	}
}

// TestDecisionStagesAllFive: one KV request records a sample in
// kvgate_decision_stage_seconds for each of extract, tokenize, hash, score
// and select.
func TestDecisionStagesAllFive(t *testing.T) {
	g, err := New(Options{Settings: config.DefaultSettings(), TokenizerDir: t.TempDir(), Logger: quietLogger(),
		ShutdownGrace: time.Second, Limits: limitsForTest()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown()
	vip, port := freeAddr(t)
	_, dead := freeAddr(t)
	body := fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"mode":4,"kvExactMode":3,"kvZmqPort":1,"probetype":"none"},
		"endpoints":[{"endpointIP":"127.0.0.1","targetPort":%d,"weight":1}]}`, vip, port, dead)
	id, err := g.API.Apply(mustRule(t, body), nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := g.ProxyAddr(id)
	ids := make([]string, 48)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i)
	}
	resp, err := http.Post("http://"+addr.String()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":[`+strings.Join(ids, ",")+`]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	families, err := g.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range families {
		if mf.GetName() != "kvgate_decision_stage_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					got[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	for _, stage := range []string{"extract", "tokenize", "hash", "score", "select"} {
		if got[stage] == 0 {
			t.Errorf("stage %q has no samples (got %v)", stage, got)
		}
	}
}

// TestScoreModeSpellings: pkg/config parses LOXILB_KV_SCORE with pkg/selector's
// parser, so both accept the same spellings and give the same allowed values.
func TestScoreModeSpellings(t *testing.T) {
	for _, v := range []string{"leading", "prefix", "overlap", "Leading", "best", "leading-run"} {
		s, cerr := config.SettingsFromLookup(func(k string) (string, bool) { return v, k == "LOXILB_KV_SCORE" })
		o, serr := selector.ParseScoreMode(v)
		if (cerr == nil) != (serr == nil) {
			t.Fatalf("%q: config err %v, selector err %v", v, cerr, serr)
		}
		if cerr != nil {
			var pe *selector.ParseError
			if !errors.As(serr, &pe) || !strings.Contains(cerr.Error(), "LOXILB_KV_SCORE") || !strings.Contains(cerr.Error(), pe.Allowed) {
				t.Errorf("%q: texts differ:\n config   %v\n selector %v", v, cerr, serr)
			}
			continue
		}
		if s.Score != o {
			t.Errorf("%q: config %v, selector %v", v, s.Score, o)
		}
	}
}
