package e2e

import (
	"bytes"
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
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/models"
	"github.com/kvgate/kvgate/pkg/status"
)

// modelB is a second model that shares model's tokenizer and, through
// PYTHONHASHSEED=0 on every engine, its block hashes: the case where only
// per-model keying keeps the two inventories apart.
const modelB = "acme/qwen3-b"

// TestManyModelsOneRule runs the real kvgate daemon over two real enginesim
// processes behind one KV rule: .11 and .12 serve model (with the LoRA
// adapter sql-lora), .13 and .14 serve modelB, and .13 may load adapters at
// run time. kvgate learns all of it from GET /v1/models
// (LLB_KV_MODEL_DISCOVERY_SEC=1); no kvLoraAdapters is listed. Each model's
// requests go only to its engines and warm-hit there; the same prompt for
// the other model matches nothing even though both engines publish the
// very same hashes; an unknown model is answered 404 model_not_found and
// counted; an adapter loaded at run time is routed within the interval.
func TestManyModelsOneRule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := buildCommands(t, "kvgate", "enginesim", "kvctl")
	block := testnet.Block(t)
	hosts := []string{block + "11", block + "12", block + "13", block + "14"}
	eport := testnet.Port(t, hosts[0])
	common := []string{"--port", fmt.Sprint(eport), "--replicas", "2", "--tokenizer", repoTokenizerDir(t), "--time-scale", "0.05", "--log-level", "warn"}
	engA := startProc(t, []string{"PYTHONHASHSEED=0"}, filepath.Join(dir, "enginesim"),
		append([]string{"--host", hosts[0], "--model", model, "--lora-modules", "sql-lora"}, common...)...)
	engB := startProc(t, []string{"PYTHONHASHSEED=0"}, filepath.Join(dir, "enginesim"),
		append([]string{"--host", hosts[2], "--model", modelB, "--allow-runtime-lora-updating"}, common...)...)
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
	gw, tg := startModelsGateway(t, dir, block, 1, "--decision-header")
	vip, vport := block+"1", testnet.Port(t, block+"1")
	var eps []string
	for _, h := range hosts {
		eps = append(eps, fmt.Sprintf(`{"endpointIP":%q,"targetPort":%d,"weight":1}`, h, eport))
	}
	id := tg.createRule(t, []byte(fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4,
		"kvExactMode":3,"kvZmqPort":5557,"kvHashAlgo":"sha256_cbor","kvBlockSize":16},"endpoints":[%s]}`, vip, vport, strings.Join(eps, ","))))
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, len(hosts))
	diag := func() string {
		return "\n--- kvgate:\n" + gw.logs.String() + "\n--- enginesim:\n" + engA.logs.String() + engB.logs.String()
	}
	waitFor(t, "every endpoint's /v1/models", 10*time.Second, func() bool {
		return tg.metric(t, "kvgate_endpoint_models", map[string]string{"service": svc, "ep_idx": "0"}) == 2 &&
			tg.metric(t, "kvgate_endpoint_models", map[string]string{"service": svc, "ep_idx": "3"}) == 1
	})

	// The operator sees what was discovered: status JSON, kvctl status and
	// kvctl preflight.
	wantServed := map[int]servedWant{
		0: {models: []string{model}, adapters: []models.Adapter{{Name: "sql-lora", Parent: model}}},
		1: {models: []string{model}, adapters: []models.Adapter{{Name: "sql-lora", Parent: model}}},
		2: {models: []string{modelB}}, 3: {models: []string{modelB}},
	}
	checkStatusModels(t, tg, id, wantServed)
	kvctl := filepath.Join(dir, "kvctl")
	out := runKvctl(t, kvctl, "status", "--api-server", tg.api)
	for _, want := range []string{"MODELS", model + ",sql-lora<" + model + ">", modelB + " (read "} {
		if !strings.Contains(out, want) {
			t.Fatalf("kvctl status lacks %q:\n%s", want, out)
		}
	}
	out = runKvctl(t, kvctl, "preflight", "--no-probe", "--service-id", svc, "--api-server", tg.api)
	t.Logf("kvctl preflight --no-probe:\n%s", out)
	for ep, w := range wantServed {
		row := modelsRow(out, ep)
		if !strings.Contains(row, "PASS") || !strings.Contains(row, "serves "+w.models[0]) || len(w.adapters) > 0 && !strings.Contains(row, "sql-lora (of "+model+")") {
			t.Fatalf("kvctl preflight's models row of ep %d is %q:\n%s", ep, row, out)
		}
	}

	url := fmt.Sprintf("http://%s:%d/v1/completions", vip, vport)
	engineOf := func(ep int) string { return fmt.Sprintf("%s:%d", hosts[ep], eport) }
	servesA, servesB := []string{engineOf(0), engineOf(1)}, []string{engineOf(2), engineOf(3)}
	shared := strings.Repeat("The quarterly report covers revenue, churn and the hiring plan for every region. ", 6)
	blocks := func(ep string) float64 {
		return tg.metric(t, "loxilb_pd_kv_blocks", map[string]string{"service": svc, "ep_idx": ep})
	}
	// cold sends a request for m that must land on one of want, then waits
	// until kvgate mirrors the blocks it stored.
	cold := func(m, prompt string, want []string) reply {
		t.Helper()
		r := post(t, url, map[string]any{"model": m, "prompt": prompt, "max_tokens": 2})
		if r.status != 200 || !slices.Contains(want, r.engine) || decisionField(r.decision, "tier") == "1.5" || r.cached() != 0 {
			t.Fatalf("cold %s request: %d on %q decision %q cached %d; want 200 on one of %v, no KV hit%s", m, r.status, r.engine, r.decision, r.cached(), want, diag())
		}
		ep := decisionField(r.decision, "ep")
		waitFor(t, m+"'s blocks in kvgate", 10*time.Second, func() bool { return blocks(ep) > 0 })
		return r
	}
	// warm sends a request sharing a cold one's prefix: a tier-1.5 hit on
	// the same engine, whose cached tokens are kvgate's matched blocks.
	warm := func(m, prompt string, first reply) {
		t.Helper()
		r := post(t, url, map[string]any{"model": m, "prompt": prompt, "max_tokens": 2})
		score, _ := strconv.Atoi(decisionField(r.decision, "score"))
		if r.status != 200 || decisionField(r.decision, "tier") != "1.5" || r.engine != first.engine || score < 4 || r.cached() != score*16 {
			t.Fatalf("warm %s request: %d on %q decision %q cached %d; want a tier-1.5 hit on %s with cached = score*16%s",
				m, r.status, r.engine, r.decision, r.cached(), first.engine, diag())
		}
	}

	a1 := cold(model, shared+"Summarise it.", servesA)
	warm(model, shared+"List the risks.", a1)
	// modelB's engines hash this prompt exactly as model's do, and kvgate's
	// index already holds those hashes for a1's endpoint: still no match.
	b1 := cold(modelB, shared+"Summarise it.", servesB)
	warm(modelB, shared+"List the risks.", b1)
	sameHashes(t, tg, id, decisionField(a1.decision, "ep"), decisionField(b1.decision, "ep"), shared+"Summarise it.")

	// The adapter is discovered (listed with its parent): routed to model's
	// engines, tokenized with model's tokenizer, hashed with its name.
	l1 := cold("sql-lora", shared+"Summarise it.", servesA)
	warm("sql-lora", shared+"List the risks.", l1)

	notFound := func(m string) {
		t.Helper()
		resp, err := http.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":2}`, m)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Error  string `json:"error"`
			Detail string `json:"detail"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 404 || body.Error != "model_not_found" || !strings.Contains(body.Detail, m) {
			t.Fatalf("model %q: %d %+v (%v); want 404 model_not_found naming it", m, resp.StatusCode, body, err)
		}
	}
	notFound("nobody/model")
	notFound("late-lora")
	if got := tg.metric(t, "kvgate_model_not_found_total", map[string]string{"service": svc}); got != 2 {
		t.Fatalf("kvgate_model_not_found_total %v, want 2", got)
	}

	// .13 loads an adapter at run time: routed there within the interval.
	load, err := http.Post(fmt.Sprintf("http://%s/v1/load_lora_adapter", engineOf(2)), "application/json",
		bytes.NewReader([]byte(`{"lora_name":"late-lora","lora_path":"/adapters/late"}`)))
	if err != nil {
		t.Fatal(err)
	}
	load.Body.Close()
	if load.StatusCode != 200 {
		t.Fatalf("load_lora_adapter: %d", load.StatusCode)
	}
	loaded := time.Now()
	var late reply
	waitFor(t, "the runtime adapter to be routed", 15*time.Second, func() bool {
		late = post(t, url, map[string]any{"model": "late-lora", "prompt": shared, "max_tokens": 2})
		return late.status == 200
	})
	if late.engine != engineOf(2) {
		t.Fatalf("late-lora served by %q, want %s (the only engine that loaded it)", late.engine, engineOf(2))
	}
	t.Logf("runtime adapter routed %v after it was loaded (LLB_KV_MODEL_DISCOVERY_SEC=1)", time.Since(loaded).Round(10*time.Millisecond))
	wantServed[2] = servedWant{models: []string{modelB}, adapters: []models.Adapter{{Name: "late-lora", Parent: modelB}}}
	checkStatusModels(t, tg, id, wantServed)

	for _, c := range []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"kvgate_kv_model_hits_total", map[string]string{"service": svc, "model": model}, 1},
		{"kvgate_kv_model_hits_total", map[string]string{"service": svc, "model": modelB}, 1},
		{"kvgate_kv_model_hits_total", map[string]string{"service": svc, "model": "sql-lora"}, 1},
		{"kvgate_kv_model_blocks", map[string]string{"service": svc, "model": model}, 1},
		{"kvgate_kv_model_blocks", map[string]string{"service": svc, "model": modelB}, 1},
	} {
		if got := tg.metric(t, c.name, c.labels); got < c.min {
			t.Errorf("%s%v = %v, want >= %v", c.name, c.labels, got, c.min)
		}
	}
	if got := tg.metric(t, "kvgate_kv_model_hits_total", map[string]string{"service": svc, "model": "nobody/model"}); got != 0 {
		t.Errorf("a client's unknown model became a label (%v)", got)
	}
}

// sameHashes checks that two endpoints serving different models hold the
// identical engine hashes of prompt (the inventory API shows the engines'
// hashes, whatever key the index stores them under).
func sameHashes(t *testing.T, tg *testGateway, service int, epA, epB, prompt string) {
	t.Helper()
	ids, err := engineTokenizer(t).EncodePrompt(prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	h, err := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})
	if err != nil {
		t.Fatal(err)
	}
	want := h.AppendHashes(nil, ids, kvhash.Extra{})
	for _, ep := range []string{epA, epB} {
		inv := inventory(t, tg, service, ep)
		for i, hash := range want {
			if !slices.Contains(inv, hash) {
				t.Fatalf("ep %s: block %d's engine hash %d missing from the inventory API", ep, i, hash)
			}
		}
	}
}

type servedWant struct {
	models   []string
	adapters []models.Adapter
}

// checkStatusModels checks each endpoint's models object in the daemon's
// GET /netlox/v1/status against want: served names, adapters with parent,
// a recent read and no error.
func checkStatusModels(t *testing.T, tg *testGateway, service int, want map[int]servedWant) {
	t.Helper()
	st := daemonStatus(t, tg)
	for _, r := range st.Rules {
		if r.ServiceID != service {
			continue
		}
		if len(r.Endpoints) != len(want) {
			t.Fatalf("status shows %d endpoints, want %d", len(r.Endpoints), len(want))
		}
		for _, e := range r.Endpoints {
			w, m := want[e.EPIdx], e.Models
			if m == nil || !slices.Equal(m.Served, w.models) || !slices.Equal(m.Adapters, w.adapters) || m.Error != "" ||
				m.CheckedAt == nil || m.CheckedAgeSeconds < 0 || m.CheckedAgeSeconds > 30 {
				t.Fatalf("status of ep %d: models %+v, want served %v adapters %v, read recently without error", e.EPIdx, m, w.models, w.adapters)
			}
		}
		return
	}
	t.Fatalf("status has no rule %d", service)
}

// runKvctl runs the real kvctl binary and returns its output; a non-zero
// exit fails the test.
func runKvctl(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kvctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// modelsRow is kvctl preflight's models row of ep ("" none).
func modelsRow(out string, ep int) string {
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "models" && f[1] == strconv.Itoa(ep) {
			return line
		}
	}
	return ""
}

// TestModelFollowsEngineRestart: an engine restarted on the same address
// with another model is re-read, and routing follows, with real kvgate and
// enginesim processes. Discovery's interval is an hour here, so only the
// restart signals can explain the re-read: the probe coming back up after
// it marked the engine down (a slow restart), or, for a restart faster than
// probeRetries probes, the KV-event subscription's reconnect. The bounds
// checked are the documented ones (docs/selection.md, "Many models behind
// one rule"), with 4x slack for this shared machine.
func TestModelFollowsEngineRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := buildCommands(t, "kvgate", "enginesim")
	const probeInterval, probeTimeout = 1, 1
	tests := []struct {
		name string
		// probeRetries: 2 lets the probe see the slow restart; 30 keeps
		// the probe from ever marking the fast one down.
		probeRetries int
		waitDown     bool
		bound        time.Duration
	}{
		{"slow restart: probe down, then up", 2, true, (probeInterval + 2*probeTimeout) * time.Second},
		{"fast restart: the probe never sees it down", 30, false, 5*time.Second + (probeInterval+probeTimeout)*time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			restartWithAnotherModel(t, dir, probeInterval, probeTimeout, tc.probeRetries, tc.waitDown, tc.bound)
		})
	}
}

func restartWithAnotherModel(t *testing.T, dir string, probeInterval, probeTimeout, probeRetries int, waitDown bool, bound time.Duration) {
	block := testnet.Block(t)
	hosts := []string{block + "11", block + "12"}
	eport := testnet.Port(t, hosts[0])
	engine := func(host, m string) *proc {
		p := startProc(t, []string{"PYTHONHASHSEED=0"}, filepath.Join(dir, "enginesim"), "--host", host, "--port", fmt.Sprint(eport),
			"--model", m, "--tokenizer", repoTokenizerDir(t), "--time-scale", "0.05", "--log-level", "warn")
		waitFor(t, "enginesim on "+host, 30*time.Second, func() bool {
			resp, err := http.Get(fmt.Sprintf("http://%s:%d/health", host, eport))
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
		return p
	}
	engine(hosts[0], model)
	second := engine(hosts[1], model)
	gw, tg := startModelsGateway(t, dir, block, 3600)
	vip, vport := block+"1", testnet.Port(t, block+"1")
	id := tg.createRule(t, []byte(fmt.Sprintf(`{"serviceArguments":{"externalIP":%q,"port":%d,"protocol":"tcp","sel":0,"mode":4,
		"kvExactMode":3,"kvZmqPort":5557,"kvHashAlgo":"sha256_cbor","kvBlockSize":16,"probeInterval":%d,"probeTimeout":%d,"probeRetries":%d},
		"endpoints":[{"endpointIP":%q,"targetPort":%d,"weight":1},{"endpointIP":%q,"targetPort":%d,"weight":1}]}`,
		vip, vport, probeInterval, probeTimeout, probeRetries, hosts[0], eport, hosts[1], eport)))
	svc := strconv.Itoa(id)
	tg.waitSubscribed(t, id, 2)
	both := servedWant{models: []string{model}}
	waitFor(t, "both endpoints read", 10*time.Second, func() bool {
		return tg.metric(t, "kvgate_endpoint_models", map[string]string{"service": svc, "ep_idx": "1"}) == 1
	})
	checkStatusModels(t, tg, id, map[int]servedWant{0: both, 1: both})
	url := fmt.Sprintf("http://%s:%d/v1/completions", vip, vport)
	if r := post(t, url, map[string]any{"model": modelB, "prompt": "hello", "max_tokens": 2}); r.status != 404 {
		t.Fatalf("%s before the restart: %d, want 404 model_not_found", modelB, r.status)
	}

	second.kill()
	if waitDown {
		waitFor(t, "the probe to mark the engine down", 20*time.Second, func() bool { return endpointHealth(t, tg, id, 1) == "down" })
	}
	engine(hosts[1], modelB)
	back := time.Now()
	if !waitDown && endpointHealth(t, tg, id, 1) != "up" {
		t.Fatal("the probe marked the fast restart down: the case does not test the reconnect path")
	}
	engineB := fmt.Sprintf("%s:%d", hosts[1], eport)
	var last reply
	waitFor(t, modelB+" to route to the restarted engine", 8*bound, func() bool {
		last = post(t, url, map[string]any{"model": modelB, "prompt": "hello there", "max_tokens": 2})
		return last.status == 200 && last.engine == engineB
	})
	took := time.Since(back)
	t.Logf("%s routed to the restarted engine %v after it answered /health (documented bound %v)", modelB, took.Round(10*time.Millisecond), bound)
	if took > 4*bound {
		t.Fatalf("routing followed the restart after %v, beyond 4x the documented %v\n--- kvgate:\n%s", took, bound, gw.logs.String())
	}
	checkStatusModels(t, tg, id, map[int]servedWant{0: both, 1: {models: []string{modelB}}})
	for i := range 4 {
		r := post(t, url, map[string]any{"model": model, "prompt": fmt.Sprintf("request %d for the first model", i), "max_tokens": 2})
		if r.status != 200 || r.engine != fmt.Sprintf("%s:%d", hosts[0], eport) {
			t.Fatalf("%s after the restart: %d on %q, want 200 on the only engine still serving it", model, r.status, r.engine)
		}
	}
}

// startModelsGateway starts the kvgate binary in dir on block's .2, with
// both models' tokenizers staged (each under its own slug, the spec's path)
// and model discovery every discoverySec, and waits for /readyz.
func startModelsGateway(t *testing.T, dir, block string, discoverySec int, args ...string) (*proc, *testGateway) {
	t.Helper()
	staging := stagingDir(t)
	if err := os.Symlink(repoTokenizerDir(t), filepath.Join(staging, strings.ReplaceAll(modelB, "/", "__"))); err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	gw := startProc(t, []string{"LLB_KV_NONE_HASH_SEED=0", fmt.Sprintf("LLB_KV_MODEL_DISCOVERY_SEC=%d", discoverySec)}, filepath.Join(dir, "kvgate"),
		append([]string{"--api", api, "--state-dir", t.TempDir(), "--tokenizer-dir", staging}, args...)...)
	tg := &testGateway{api: "http://" + api}
	waitFor(t, "the management API", 20*time.Second, func() bool {
		resp, err := http.Get(tg.api + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return gw, tg
}

// daemonStatus is the daemon's GET /netlox/v1/status.
func daemonStatus(t *testing.T, tg *testGateway) status.Status {
	t.Helper()
	resp, err := http.Get(tg.api + "/netlox/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st status.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("status: %v", err)
	}
	return st
}

// endpointHealth is ep's health in the daemon's status ("" not shown).
func endpointHealth(t *testing.T, tg *testGateway, service, ep int) string {
	t.Helper()
	st := daemonStatus(t, tg)
	for _, r := range st.Rules {
		for _, e := range r.Endpoints {
			if r.ServiceID == service && e.EPIdx == ep {
				return e.Health
			}
		}
	}
	return ""
}
