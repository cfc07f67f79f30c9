// Package preflight automates the post-configuration gate of a KV rule (the
// spec's §6 metric families and §9 "verify it actually fired"): kvgate runs
// every check itself, since the host kvctl runs on may not reach the engines.
// POST /netlox/v1/config/ai/kv/preflight?service_id=N[&probe=0] answers a
// Report; kvctl preflight prints it. See docs/preflight.md.
//
// Checks, in order: health (each endpoint's /health and /v1/models), models
// (what kvgate's own model discovery read from each endpoint), metrics
// (the engine's metric families and vllm:cache_config_info against the rule),
// kv_events (the KV-event port and kvgate's subscriber), tokenizer (staged for
// every served model, and equal to the engine's /tokenize), parity (the live
// self-check of docs/parity.md), probe (a unique prompt twice through the
// rule's VIP) and usage (the repeat reported prompt_tokens_details, which
// the per-request usage audit reads). The run is read-only apart from the
// two probe requests.
//
// Knobs: none. Metrics: none; the checks read kvgate's own.
package preflight

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/apiauth"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/models"
	"github.com/kvgate/kvgate/pkg/usageaudit"
)

// Results of a check and of the whole run.
const (
	Pass = "pass"
	Warn = "warn"
	Fail = "fail"
	Skip = "skip"
)

// Check ids, in the order they run.
const (
	CheckHealth = "health"
	// CheckModels: what kvgate's own model discovery read from each
	// endpoint (the listing routing uses), and whether a tokenizer is
	// staged for any model it serves.
	CheckModels    = "models"
	CheckMetrics   = "metrics"
	CheckKVEvents  = "kv_events"
	CheckTokenizer = "tokenizer"
	CheckParity    = "parity"
	CheckProbe     = "probe"
	// CheckUsage: the probe's repeat (a cache hit) reported
	// usage.prompt_tokens_details.cached_tokens, which the per-request usage
	// audit needs (docs/parity.md).
	CheckUsage = "usage"
)

// Check is one row of the report. EPIdx is -1 for a rule-wide row.
type Check struct {
	ID     string `json:"id"`
	EPIdx  int    `json:"ep_idx"`
	Result string `json:"result"`
	Detail string `json:"detail"`
	Fix    string `json:"fix"`
}

// Report is the preflight's answer: result "fail" when any check failed.
type Report struct {
	Result string  `json:"result"`
	Checks []Check `json:"checks"`
}

// Source is what the preflight reads from the running gateway.
type Source interface {
	// SubscriberConnected reports whether every rank of the endpoint's
	// KV-event subscriber is connected (known false: no subscriber).
	SubscriberConnected(service, epIdx int) (connected, known bool)
	// Parity is the rule's live parity self-check (nil: none).
	Parity(service int) *ingest.Parity
	// StagedTokenizer reports whether model's tokenizer loads, and where it
	// is expected.
	StagedTokenizer(model string) (path string, err error)
	// Tokenize returns the ids kvgate computes for a completion prompt.
	Tokenize(model, prompt string) ([]uint32, error)
	// PredictHashes returns the hashes kvgate scores a completion prompt with.
	PredictHashes(service int, model, prompt string) ([]uint64, error)
	// Inventory returns the hashes kvgate mirrors for an endpoint.
	Inventory(service, epIdx int) ([]uint64, bool)
	// Tier15Hits reads loxilb_pd_kv_tier15_hits_total{service,ep_idx}.
	Tier15Hits(service, epIdx int) float64
	// EngineClient is the rule's engine-facing client, https on a
	// security-2 rule (nil: plain HTTP).
	EngineClient(service int) *engineclient.Client
	// DiscoveredModels is what the rule's model discovery read from an
	// endpoint (false: the rule runs no discovery).
	DiscoveredModels(service, epIdx int) (models.EndpointState, bool)
	// VIPClientTLS is what the probe requests verify the rule's VIP with
	// when it terminates TLS (security >= 1): it accepts the certificate
	// kvgate serves there now. nil for a plain rule.
	VIPClientTLS(service int) (*tls.Config, error)
}

// Runner runs preflights. Safe for concurrent use.
type Runner struct {
	src    Source
	client *http.Client
	// probeClient sends the probe requests through the VIP: a loaded
	// engine may take longer than a metrics scrape to answer one.
	probeClient *http.Client
	// InventoryWait bounds the wait for the probe's BlockStored events.
	InventoryWait time.Duration

	// token is the rule's backendTokenFile token for one run (Run works on
	// a copy of the Runner), sent on every engine call and probe request;
	// tokenErr is why it could not be read.
	token    string
	tokenErr error
	// engine is the rule's engine client for one run (client is over it);
	// vipScheme is https on a TLS rule, and vipErr why the probe requests
	// cannot verify its VIP.
	engine    *engineclient.Client
	vipScheme string
	vipErr    error
}

// Timeouts of one engine call and of one probe request through the VIP (a
// loaded engine may take longer than a metrics scrape to answer one).
const (
	engineCallTimeout   = 5 * time.Second
	vipProbeTimeout     = 20 * time.Second
	vipProbeDialTimeout = 2 * time.Second
)

// New returns a Runner reading src.
func New(src Source) *Runner {
	engine := engineclient.New(nil)
	return &Runner{src: src, engine: engine, client: engine.HTTP(engineCallTimeout),
		probeClient: vipClient(nil), vipScheme: "http", InventoryWait: 5 * time.Second}
}

// vipClient sends the probe requests through the VIP, like any client:
// one connection per request, verified with cfg on a TLS rule.
func vipClient(cfg *tls.Config) *http.Client {
	tr := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: vipProbeDialTimeout}).DialContext, DisableKeepAlives: true,
		TLSClientConfig: cfg, TLSHandshakeTimeout: vipProbeDialTimeout}
	return &http.Client{Timeout: vipProbeTimeout, Transport: tr}
}

// maxBody bounds what the preflight reads from an engine or the VIP.
const maxBody = 8 << 20

type endpointFacts struct {
	ep      config.Endpoint
	healthy bool
	models  []string // base models the engine serves
	loras   []string
}

// Run runs every check against rule; probe=false skips the probe requests.
// The rule's backendTokenFile is read afresh: its token goes as a bearer
// token on the engine calls and on the probe requests through the VIP,
// which kvgate relays with the client's own Authorization, as it does any
// client's.
func (r *Runner) Run(ctx context.Context, rule *config.Rule, probe bool) Report {
	return r.forRule(rule).run(ctx, rule, probe)
}

// forRule is a copy of r carrying rule's backend token, so concurrent runs
// for different rules share nothing mutable.
func (r *Runner) forRule(rule *config.Rule) *Runner {
	run := *r
	run.token, run.tokenErr = "", nil
	if path := rule.Args.BackendTokenFile; path != "" {
		run.token, run.tokenErr = apiauth.LoadBackendTokenFile(path)
	}
	if r.src == nil {
		return &run
	}
	if ec := r.src.EngineClient(rule.ServiceID); ec != nil {
		run.engine = ec
		run.client = ec.HTTP(engineCallTimeout)
	}
	if rule.TerminatesTLS() {
		run.vipScheme = "https"
		cfg, err := r.src.VIPClientTLS(rule.ServiceID)
		run.vipErr = err
		if err == nil && cfg == nil {
			run.vipErr = errors.New("the rule's TLS terminator is not running")
		}
		run.probeClient = vipClient(cfg)
	}
	return &run
}

func (r *Runner) run(ctx context.Context, rule *config.Rule, probe bool) Report {
	var rep Report
	add := func(c Check) { rep.Checks = append(rep.Checks, c) }
	if r.tokenErr != nil {
		add(Check{ID: CheckHealth, EPIdx: -1, Result: Warn, Detail: "backendTokenFile: " + r.tokenErr.Error() + "; the engine calls go without a token",
			Fix: "fix the file (mode 0600, owned by kvgate's user or root, the token on its first non-empty line)"})
	}
	facts := make([]*endpointFacts, 0, len(rule.Endpoints))
	for _, e := range rule.Endpoints {
		f := &endpointFacts{ep: e}
		facts = append(facts, f)
		add(r.checkHealth(ctx, f))
	}
	for _, c := range r.checkModels(rule) {
		add(c)
	}
	kv := map[int]bool{}
	for _, e := range rule.KVEndpoints() {
		kv[e.Idx] = true
	}
	for _, f := range facts {
		if !f.healthy {
			add(Check{ID: CheckMetrics, EPIdx: f.ep.Idx, Result: Skip, Detail: "endpoint not healthy"})
			continue
		}
		add(r.checkMetrics(ctx, rule, f))
	}
	for _, f := range facts {
		if !kv[f.ep.Idx] {
			continue
		}
		add(r.checkKVEvents(ctx, rule, f))
	}
	for _, c := range r.checkTokenizers(ctx, rule, facts) {
		add(c)
	}
	// The probe runs before the parity rows are read, although it is listed
	// after them: its first request is the BlockStored the parity check
	// needs on an engine that had no traffic yet.
	probeRow := Check{ID: CheckProbe, EPIdx: -1, Result: Skip, Detail: "probe disabled (probe=0 / --no-probe)"}
	var usageRow *Check
	if probe {
		probeRow, usageRow = r.probe(ctx, rule, facts, kv)
	}
	for _, c := range r.checkParity(ctx, rule, facts, kv) {
		add(c)
	}
	add(probeRow)
	if usageRow != nil {
		add(*usageRow)
	}
	rep.Result = Pass
	for _, c := range rep.Checks {
		if c.Result == Fail {
			rep.Result = Fail
		}
	}
	return rep
}

func (r *Runner) get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	r.authorize(req)
	return r.do(req)
}

func (r *Runner) postJSON(ctx context.Context, url string, body any) (*http.Response, []byte, error) {
	return r.postWith(ctx, r.client, url, body)
}

func (r *Runner) postWith(ctx context.Context, client *http.Client, url string, body any) (*http.Response, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	r.authorize(req)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return resp, out, err
}

func (r *Runner) authorize(req *http.Request) {
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
}

func (r *Runner) do(req *http.Request) (int, []byte, error) {
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return resp.StatusCode, b, err
}

// baseURL is the endpoint's address with the rule's scheme (https on a
// security-2 rule).
func (r *Runner) baseURL(e config.Endpoint) string {
	return r.engine.URL(e.IP, e.TargetPort, "")
}

// checkHealth is check 1: /health and /v1/models, and what the engine serves.
func (r *Runner) checkHealth(ctx context.Context, f *endpointFacts) Check {
	c := Check{ID: CheckHealth, EPIdx: f.ep.Idx}
	base := r.baseURL(f.ep)
	code, _, err := r.get(ctx, base+"/health")
	if err != nil || code != http.StatusOK {
		c.Result, c.Detail = Fail, fmt.Sprintf("GET %s/health: %s", base, r.httpErr(code, err))
		c.Fix = fixFor(code, "start the engine, or correct the endpoint's address and port in the rule")
		if engineclient.Hint(err) != "" {
			c.Fix = fixTLS
		}
		return c
	}
	code, body, err := r.get(ctx, base+"/v1/models")
	if err != nil || code != http.StatusOK {
		c.Result, c.Detail = Fail, fmt.Sprintf("GET %s/v1/models: %s", base, r.httpErr(code, err))
		c.Fix = fixFor(code, "the endpoint must serve vLLM's OpenAI API")
		return c
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || len(list.Data) == 0 {
		c.Result, c.Detail, c.Fix = Fail, fmt.Sprintf("GET %s/v1/models: no model listed", base), "the endpoint must serve vLLM's OpenAI API"
		return c
	}
	for _, m := range list.Data {
		if m.Parent != nil && *m.Parent != "" && *m.Parent != m.ID {
			f.loras = append(f.loras, m.ID)
		} else {
			f.models = append(f.models, m.ID)
		}
	}
	f.healthy = true
	c.Result = Pass
	c.Detail = "serves " + strings.Join(f.models, ", ")
	if len(f.loras) > 0 {
		c.Detail += "; LoRA adapters " + strings.Join(f.loras, ", ")
	}
	return c
}

// checkModels is a row per endpoint: what kvgate's model discovery read
// from its GET /v1/models (docs/selection.md, "Many models behind one
// rule"). It warns when the last read failed, when none happened yet, and
// when no served model (an adapter: its parent) has a tokenizer staged, so
// none of the endpoint's requests can be hashed. One rule-wide skip row
// when the rule runs no discovery.
func (r *Runner) checkModels(rule *config.Rule) []Check {
	if r.src == nil {
		return nil
	}
	var out []Check
	for _, e := range rule.Endpoints {
		st, ok := r.src.DiscoveredModels(rule.ServiceID, e.Idx)
		if !ok {
			return []Check{{ID: CheckModels, EPIdx: -1, Result: Skip,
				Detail: "model discovery is off for this rule (LLB_KV_MODEL_DISCOVERY_SEC=0): every endpoint is a candidate for every model"}}
		}
		out = append(out, r.checkEndpointModels(e, st, time.Now()))
	}
	return out
}

const fixDiscovery = "make the endpoint answer GET /v1/models (vLLM's OpenAI API) to kvgate; kvgate_model_discovery_errors_total counts failed reads"

func (r *Runner) checkEndpointModels(e config.Endpoint, st models.EndpointState, now time.Time) Check {
	c := Check{ID: CheckModels, EPIdx: e.Idx}
	served := describeServed(st.Served)
	switch {
	case st.CheckedAt.IsZero():
		c.Result, c.Detail = Warn, "kvgate's model discovery has not read this endpoint yet: it is a candidate for every model until it does"
		c.Fix = "wait for the first read (it is bounded by the rule's probeTimeout) and run the preflight again"
		return c
	case st.Err != "" && len(st.Served.Bases) == 0:
		c.Result, c.Detail, c.Fix = Warn, "model discovery failed: "+st.Err+"; until a read succeeds the endpoint is a candidate for every model", fixDiscovery
		return c
	case st.Err != "":
		c.Result, c.Detail, c.Fix = Warn, "model discovery failed: "+st.Err+"; routing keeps what it listed before: "+served, fixDiscovery
		return c
	}
	age := now.Sub(st.CheckedAt).Round(time.Second)
	var staged, missing []string
	for _, m := range tokenizerModels(st.Served) {
		if _, err := r.src.StagedTokenizer(m); err == nil {
			staged = append(staged, m)
		} else {
			missing = append(missing, m)
		}
	}
	if len(staged) == 0 {
		path, _ := r.src.StagedTokenizer(st.Served.Base())
		c.Result = Warn
		c.Detail = fmt.Sprintf("serves %s (read %s ago), but no tokenizer is staged for %s: its requests cannot be hashed and route without the KV tier",
			served, age, strings.Join(missing, " or "))
		c.Fix = "stage the model's tokenizer.json (and tokenizer_config.json) at " + path
		return c
	}
	c.Result = Pass
	c.Detail = fmt.Sprintf("serves %s (read %s ago); tokenizer staged for %s", served, age, strings.Join(staged, ", "))
	return c
}

// describeServed spells a listing: base models, then adapters with parents.
func describeServed(s models.Served) string {
	out := strings.Join(s.Bases, ", ")
	if len(s.Adapters) > 0 {
		ads := make([]string, 0, len(s.Adapters))
		for _, a := range s.AdapterList() {
			ads = append(ads, a.Name+" (of "+a.Parent+")")
		}
		out += "; LoRA adapters " + strings.Join(ads, ", ")
	}
	return out
}

// tokenizerModels are the models whose staged tokenizers encode an
// endpoint's requests: each base model, and each adapter's parent (as vLLM
// tokenizes an adapter's prompts with its base model's tokenizer).
func tokenizerModels(s models.Served) []string {
	out := slices.Clone(s.Bases)
	for _, a := range s.AdapterList() {
		if !slices.Contains(out, a.Parent) {
			out = append(out, a.Parent)
		}
	}
	return out
}

// httpErr spells a failed call; a 401 or 403 says what to fix about the
// rule's backendTokenFile.
func (r *Runner) httpErr(code int, err error) string {
	if err != nil {
		return engineclient.Explain(err).Error()
	}
	s := "HTTP " + strconv.Itoa(code)
	if code != http.StatusUnauthorized && code != http.StatusForbidden {
		return s
	}
	switch {
	case r.tokenErr != nil:
		return s + ": " + health.ReasonEngineWantsToken + "; no token in force: " + r.tokenErr.Error()
	case r.token == "":
		return s + ": " + health.ReasonEngineWantsToken
	}
	return s + ": engine refused the token of backendTokenFile (is it the engine's current key?)"
}

// fixTLS is the fix of an engine call whose TLS handshake failed on a
// security-2 rule (the detail carries engineclient's hint of which part).
const fixTLS = "give the engine a certificate for the endpoint's address signed by a CA in the rule's mtls_backend.backend_ca_path, or serve it over https (docs/security.md, \"kvgate's own calls to the engines\")"

// fixFor is the fix of a failed engine call: the token's when the engine
// refused kvgate's credentials, else otherwise.
func fixFor(code int, otherwise string) string {
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		return "put the engine's key (vLLM's --api-key) alone in a file of mode 0600 and name it in the rule's backendTokenFile (docs/security.md)"
	}
	return otherwise
}

// Metric families of the spec's §6.4; the lazy ones appear after the first request.
var (
	eagerFamilies = []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"}
	lazyFamilies  = []string{"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket"}
)

// checkMetrics is check 2: the engine's cache configuration against the
// rule — vLLM's metric families and vllm:cache_config_info, SGLang's page
// size from /get_server_info, TensorRT-LLM's tokens_per_block and block-key
// algorithm from /server_info.
func (r *Runner) checkMetrics(ctx context.Context, rule *config.Rule, f *endpointFacts) Check {
	switch rule.EffectiveEngine() {
	case config.EngineSGLang:
		return r.checkServerInfo(ctx, rule, f, "/get_server_info", "page_size", "")
	case config.EngineTRTLLM:
		return r.checkServerInfo(ctx, rule, f, "/server_info", "tokens_per_block", "kv_cache_hash_algo")
	}
	c := Check{ID: CheckMetrics, EPIdx: f.ep.Idx}
	base := r.baseURL(f.ep)
	code, body, err := r.get(ctx, base+"/metrics")
	if err != nil || code != http.StatusOK {
		c.Result, c.Detail, c.Fix = Fail, fmt.Sprintf("GET %s/metrics: %s", base, r.httpErr(code, err)), fixFor(code, "expose vLLM's Prometheus /metrics on the serving port")
		return c
	}
	fams := parseFamilies(body)
	var missing, cold []string
	for _, n := range eagerFamilies {
		if _, ok := fams[n]; !ok {
			missing = append(missing, n)
		}
	}
	for _, n := range lazyFamilies {
		if _, ok := fams[n]; !ok {
			cold = append(cold, n)
		}
	}
	if len(missing) > 0 {
		c.Result, c.Detail = Fail, "missing metric families "+strings.Join(missing, ", ")
		c.Fix = "run a vLLM v1 engine (kvgate reads vllm:kv_cache_usage_perc, not gpu_cache_usage_perc)"
		return c
	}
	info := fams["vllm:cache_config_info"]
	unit := info["prefix_match_unit"]
	unitName := "prefix_match_unit"
	if unit == "" {
		unit, unitName = info["block_size"], "block_size"
	}
	algo := info["prefix_caching_hash_algo"]
	c.Detail = fmt.Sprintf("%s=%s prefix_caching_hash_algo=%s num_gpu_blocks=%s", unitName, unit, algo, info["num_gpu_blocks"])
	var fixes []string
	if n, err := strconv.Atoi(unit); err == nil && n != rule.BlockSize() {
		fixes = append(fixes, fmt.Sprintf("the engine hashes blocks of %d tokens (%s) and the rule has kvBlockSize=%d: set kvBlockSize=%d or the engine's --block-size %d", n, unitName, rule.BlockSize(), n, rule.BlockSize()))
	}
	if algo != "" && algo != rule.EffectiveHashAlgo() {
		fixes = append(fixes, fmt.Sprintf("the engine hashes with %s and the rule has kvHashAlgo=%s: set kvHashAlgo=%s or the engine's --prefix-caching-hash-algo %s", algo, rule.EffectiveHashAlgo(), algo, rule.EffectiveHashAlgo()))
	}
	if info["enable_prefix_caching"] == "False" {
		fixes = append(fixes, "the engine runs without prefix caching: start it with --enable-prefix-caching")
	}
	switch {
	case len(fixes) > 0:
		c.Result, c.Fix = Fail, strings.Join(fixes, "; ")
	case len(cold) > 0:
		c.Result = Warn
		c.Detail += "; cold engine, lazy families missing: " + strings.Join(cold, ", ")
		c.Fix = "warm up first: send one request to the engine, then run the preflight again"
	default:
		c.Result = Pass
	}
	return c
}

// checkServerInfo reads an SGLang or TensorRT-LLM server's info document:
// its block size must equal kvBlockSize (these engines hash whole pages, so
// there is no granularity to bridge), and TensorRT-LLM's block keys must be
// the v1 hash kvgate computes (docs/engines.md).
func (r *Runner) checkServerInfo(ctx context.Context, rule *config.Rule, f *endpointFacts, path, sizeKey, algoKey string) Check {
	c := Check{ID: CheckMetrics, EPIdx: f.ep.Idx}
	base := r.baseURL(f.ep)
	code, body, err := r.get(ctx, base+path)
	if err != nil || code != http.StatusOK {
		c.Result = Warn
		c.Detail = fmt.Sprintf("GET %s%s: %s; the engine's block size could not be compared with kvBlockSize=%d", base, path, r.httpErr(code, err), rule.BlockSize())
		c.Fix = "serve " + path + " (a current " + rule.EffectiveEngine() + " does) so the preflight can read the block size"
		return c
	}
	var info map[string]any
	if err := json.Unmarshal(body, &info); err != nil {
		c.Result, c.Detail = Warn, fmt.Sprintf("GET %s%s is not a JSON object: %v", base, path, err)
		return c
	}
	size, _ := info[sizeKey].(float64)
	c.Detail = fmt.Sprintf("%s=%v", sizeKey, info[sizeKey])
	var fixes []string
	if size > 0 && int(size) != rule.BlockSize() {
		fixes = append(fixes, fmt.Sprintf("the engine's %s is %d and the rule has kvBlockSize=%d: set kvBlockSize=%d", sizeKey, int(size), rule.BlockSize(), int(size)))
	}
	if algoKey != "" {
		algo, _ := info[algoKey].(string)
		c.Detail += fmt.Sprintf(" %s=%s", algoKey, algo)
		switch algo {
		case "", "v1_block_key", "auto":
		default:
			fixes = append(fixes, fmt.Sprintf("the engine's %s is %s; kvgate computes TensorRT-LLM's v1 block key only: start it with %s v1_block_key", algoKey, algo, algoKey))
		}
	}
	switch {
	case len(fixes) > 0:
		c.Result, c.Fix = Fail, strings.Join(fixes, "; ")
	case size == 0:
		c.Result, c.Fix = Warn, "the engine's "+path+" names no "+sizeKey+"; check kvBlockSize by hand"
	default:
		c.Result = Pass
	}
	return c
}

// parseFamilies reads Prometheus text exposition: every sample name present,
// with the labels of its first sample.
func parseFamilies(body []byte) map[string]map[string]string {
	out := map[string]map[string]string{}
	for line := range strings.SplitSeq(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if _, ok := out[name]; ok {
			continue
		}
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			if end := strings.LastIndexByte(rest, '}'); end > 0 {
				parseLabels(rest[1:end], labels)
			}
		}
		out[name] = labels
	}
	return out
}

func parseLabels(s string, into map[string]string) {
	for len(s) > 0 && len(into) < 64 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return
		}
		key := strings.TrimSpace(strings.TrimPrefix(s[:eq], ","))
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			val.WriteByte(s[i])
		}
		into[key] = val.String()
		if i+1 >= len(s) {
			return
		}
		s = strings.TrimPrefix(s[i+1:], ",")
	}
}

// checkKVEvents is check 3: every rank's PUB port accepts TCP from kvgate,
// and kvgate's subscriber is connected.
func (r *Runner) checkKVEvents(ctx context.Context, rule *config.Rule, f *endpointFacts) Check {
	c := Check{ID: CheckKVEvents, EPIdx: f.ep.Idx}
	if rule.EffectiveEngine() == config.EngineTRTLLM {
		// TensorRT-LLM publishes no ZeroMQ stream: kvgate drains POST
		// /kv_cache_events on the serving port, so "connected" is the drain.
		connected, known := r.src.SubscriberConnected(rule.ServiceID, f.ep.Idx)
		if known && connected {
			c.Result, c.Detail = Pass, "kvgate drains the engine's /kv_cache_events"
		} else {
			c.Result, c.Detail = Fail, "kvgate's /kv_cache_events drain of this endpoint is not running"
			c.Fix = "start trtllm-serve with KV-cache events enabled (event_buffer_max_size > 0) and let kvgate reach its serving port"
		}
		return c
	}
	var unreachable []string
	for rank := range rule.DpRankCount() {
		addr := net.JoinHostPort(f.ep.IP, strconv.Itoa(rule.ZmqPort()+rank))
		d := net.Dialer{Timeout: 2 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			unreachable = append(unreachable, addr)
			continue
		}
		_ = conn.Close()
	}
	connected, known := r.src.SubscriberConnected(rule.ServiceID, f.ep.Idx)
	switch {
	case len(unreachable) > 0:
		c.Result, c.Detail = Fail, "KV-event port unreachable from kvgate: "+strings.Join(unreachable, ", ")
		c.Fix = fmt.Sprintf(`start the engine with --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%d","topic":"kv-events"}' and open the port to kvgate`, rule.ZmqPort())
	case !known || !connected:
		c.Result, c.Detail = Fail, "kvgate's KV-event subscriber is not connected"
		c.Fix = "check kvZmqPort and kvDpRankCount against the engine's --kv-events-config and data-parallel size; see loxilb_kv_subscriber_connected"
	default:
		c.Result, c.Detail = Pass, fmt.Sprintf("port %d reachable (%d rank(s)); subscriber connected", rule.ZmqPort(), rule.DpRankCount())
	}
	return c
}

// tokenizerSample is the text whose ids kvgate and the engine must agree on:
// mixed scripts, digits, spacing and punctuation, where tokenizers differ.
const tokenizerSample = "kvgate preflight: Hello, world! 1234567 naïve café — 東京 🙂  tabs\tand\nnewlines."

// checkTokenizers is check 4: a staged tokenizer for every served model,
// encoding like the engine's own /tokenize.
func (r *Runner) checkTokenizers(ctx context.Context, rule *config.Rule, facts []*endpointFacts) []Check {
	var out []Check
	seen := map[string]bool{}
	for _, f := range facts {
		if !f.healthy {
			continue
		}
		for _, m := range f.models {
			key := m + "\x00" + strconv.Itoa(f.ep.Idx)
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append(out, r.checkTokenizer(ctx, f, m))
		}
	}
	if len(out) == 0 {
		out = append(out, Check{ID: CheckTokenizer, EPIdx: -1, Result: Skip, Detail: "no healthy endpoint listed a model"})
	}
	return out
}

func (r *Runner) checkTokenizer(ctx context.Context, f *endpointFacts, model string) Check {
	c := Check{ID: CheckTokenizer, EPIdx: f.ep.Idx}
	path, err := r.src.StagedTokenizer(model)
	if err != nil {
		c.Result, c.Detail = Fail, fmt.Sprintf("model %s: tokenizer not usable: %v", model, err)
		c.Fix = fmt.Sprintf("stage the model's tokenizer.json (and tokenizer_config.json) at %s", path)
		return c
	}
	ours, err := r.src.Tokenize(model, tokenizerSample)
	if err != nil {
		c.Result, c.Detail, c.Fix = Fail, fmt.Sprintf("model %s: kvgate cannot tokenize: %v", model, err), "restage the tokenizer at "+path
		return c
	}
	resp, body, err := r.postJSON(ctx, r.baseURL(f.ep)+"/tokenize", map[string]any{"model": model, "prompt": tokenizerSample})
	if err != nil || resp.StatusCode != http.StatusOK {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		c.Result = Warn
		c.Detail = fmt.Sprintf("model %s: tokenizer staged at %s; the engine's /tokenize is not available (%s), so its ids were not compared", model, path, r.httpErr(code, err))
		c.Fix = "serve vLLM's /tokenize to let the preflight compare tokenizers"
		return c
	}
	var tr struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &tr); err != nil {
		c.Result, c.Detail = Warn, fmt.Sprintf("model %s: the engine's /tokenize answer is not JSON tokens: %v", model, err)
		return c
	}
	if !slices.Equal(ours, tr.Tokens) {
		c.Result = Fail
		c.Detail = fmt.Sprintf("model %s: the tokenizer staged at %s encodes a sample to %d ids, the engine to %d (first difference at id %d)",
			model, path, len(ours), len(tr.Tokens), firstDiff(ours, tr.Tokens))
		c.Fix = fmt.Sprintf("stage the tokenizer of %s exactly as the engine serves it (copy its tokenizer.json and tokenizer_config.json) at %s", model, path)
		return c
	}
	c.Result, c.Detail = Pass, fmt.Sprintf("model %s: tokenizer staged at %s encodes like the engine", model, path)
	return c
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// checkParity is check 5: the live parity state of each KV endpoint.
func (r *Runner) checkParity(ctx context.Context, rule *config.Rule, facts []*endpointFacts, kv map[int]bool) []Check {
	p := r.src.Parity(rule.ServiceID)
	var out []Check
	if p == nil && (rule.EffectiveHashAlgo() == "sha256_sglang" || rule.EffectiveHashAlgo() == "blockhash_trtllm") {
		return append(out, Check{ID: CheckParity, EPIdx: -1, Result: Warn,
			Detail: "no live parity check for " + rule.EffectiveHashAlgo() + ": it covers vLLM's algorithms only; the probe row still proves the hashes"})
	}
	if p == nil {
		return append(out, Check{ID: CheckParity, EPIdx: -1, Result: Fail, Detail: "no live parity check: the rule has no usable vLLM hash contract",
			Fix: "set kvHashAlgo and the seed (LLB_KV_NONE_HASH_SEED or kvHashSeed) to the engines' --prefix-caching-hash-algo and PYTHONHASHSEED"})
	}
	byEP := map[int]ingest.ParityStatus{}
	// A mismatch's diagnosis runs off the ingest path: give it a moment.
	for wait := 0; wait < 40 && ctx.Err() == nil; wait++ {
		pending := false
		for _, s := range p.Status() {
			byEP[s.EPIdx] = s
			pending = pending || (s.Mismatches > 0 && s.Diagnosis == "")
		}
		if !pending {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, f := range facts {
		if !kv[f.ep.Idx] {
			continue
		}
		c := Check{ID: CheckParity, EPIdx: f.ep.Idx}
		s, ok := byEP[f.ep.Idx]
		switch {
		case ok && s.State == -1:
			c.Result, c.Detail = Fail, fmt.Sprintf("%d consecutive BlockStored events hash differently from kvgate (%s)", s.Mismatches, p.Contract())
			c.Fix = s.Diagnosis
		case ok && s.State == 1:
			c.Result, c.Detail = Pass, "BlockStored hashes match kvgate's ("+p.Contract().String()+")"
		case ok && s.Mismatches > 0:
			c.Result, c.Detail, c.Fix = Fail, "the last BlockStored hashed differently from kvgate", s.Diagnosis
		case ok && s.Checked:
			c.Result, c.Detail = Warn, "recent mismatch; matches since, but for less than 60 s"
		default:
			c.Result, c.Detail = Warn, "no BlockStored with token ids checked yet"
			c.Fix = "send a request (the probe does), then run the preflight again"
		}
		out = append(out, c)
	}
	return out
}

// probe is check 6: a unique prompt of at least 3 blocks through the VIP,
// then the same prompt again, which must be a tier-1.5 hit on the engine that
// stored the first one's blocks under the hashes kvgate predicted.
func (r *Runner) probe(ctx context.Context, rule *config.Rule, facts []*endpointFacts, kv map[int]bool) (Check, *Check) {
	c := Check{ID: CheckProbe, EPIdx: -1}
	model := ""
	for _, f := range facts {
		if f.healthy && kv[f.ep.Idx] && len(f.models) > 0 {
			model = f.models[0]
			break
		}
	}
	if model == "" {
		c.Result, c.Detail = Skip, "no healthy KV endpoint to probe"
		return c, nil
	}
	prompt, want, err := r.probePrompt(rule, model)
	if err != nil {
		c.Result, c.Detail, c.Fix = Fail, "kvgate cannot hash the probe prompt: "+err.Error(), "fix the tokenizer and hash-contract rows above"
		return c, nil
	}
	vip := r.vipScheme + "://" + net.JoinHostPort(rule.Args.ExternalIP, strconv.Itoa(rule.Args.Port)) + "/v1/completions"
	if r.vipErr != nil {
		c.Result, c.Detail = Fail, "probe requests through "+vip+": cannot verify the VIP's certificate: "+r.vipErr.Error()
		c.Fix = "check the rule's certificate in --tls-cert-dir (docs/security.md)"
		return c, nil
	}
	body := map[string]any{"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
	resp, _, err := r.postWith(ctx, r.probeClient, vip, body)
	if err != nil || resp.StatusCode != http.StatusOK {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		c.Result, c.Detail, c.Fix = Fail, "first probe request through "+vip+": "+r.httpErr(code, err), "check the rule's VIP and the endpoints' health"
		return c, nil
	}
	// The first request's BlockStored events must carry the predicted hashes.
	ep, stored := r.waitStored(ctx, rule, facts, kv, want)
	if ep < 0 {
		c.Result = Fail
		c.Detail = fmt.Sprintf("no engine announced the %d block hashes kvgate predicted for the probe (best: %d; waited up to %v)", len(want), stored, r.InventoryWait)
		c.Fix = "kvgate and the engines hash differently: see the parity and metrics rows"
		return c, nil
	}
	c.EPIdx = ep
	var target config.Endpoint
	for _, f := range facts {
		if f.ep.Idx == ep {
			target = f.ep
		}
	}
	hits0 := r.src.Tier15Hits(rule.ServiceID, ep)
	eng0, engOK := r.engineCounter(ctx, target, "vllm:prefix_cache_hits_total")
	resp, repeat, err := r.postWith(ctx, r.probeClient, vip, body)
	if err != nil || resp.StatusCode != http.StatusOK {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		c.Result, c.Detail = Fail, "second probe request: "+r.httpErr(code, err)
		return c, nil
	}
	hits := r.src.Tier15Hits(rule.ServiceID, ep) - hits0
	eng1, ok1 := r.engineCounter(ctx, target, "vllm:prefix_cache_hits_total")
	usage := checkUsageDetails(ep, repeat)
	return judgeRepeat(c, len(want), hits, resp.Header.Get("x-kvgate-decision"), engOK && ok1, eng1-eng0), &usage
}

// checkUsageDetails reads the usage of the probe's repeat. It was a cache
// hit, so an engine that reports prompt_tokens_details sends cached_tokens
// here (vLLM leaves the field out of a response with no hit even when
// enabled); without it the usage audit cannot compare cached tokens.
func checkUsageDetails(ep int, body []byte) Check {
	c := Check{ID: CheckUsage, EPIdx: ep}
	u, ok := usageaudit.ParseJSON(body)
	switch {
	case !ok:
		c.Result, c.Detail = Warn, "the probe's repeat carried no usage.prompt_tokens: the per-request usage audit skips this engine's responses"
		c.Fix = "serve OpenAI-compatible usage in completion responses"
	case !u.HasCached:
		c.Result = Warn
		c.Detail = fmt.Sprintf("the probe's repeat (a cache hit) reported prompt_tokens=%d but no prompt_tokens_details.cached_tokens: "+
			"the usage audit cannot compare cached tokens (counted as no_details)", u.PromptTokens)
		c.Fix = "start vLLM with --enable-prompt-tokens-details"
	default:
		c.Result, c.Detail = Pass, fmt.Sprintf("usage reports prompt_tokens=%d, cached_tokens=%d", u.PromptTokens, u.CachedTokens)
	}
	return c
}

// judgeRepeat decides the probe from the repeat's three proofs of delivery.
func judgeRepeat(c Check, predicted int, hits float64, decision string, engOK bool, engHits float64) Check {
	ep := c.EPIdx
	var problems []string
	if hits < 1 {
		problems = append(problems, fmt.Sprintf("loxilb_pd_kv_tier15_hits_total{ep_idx=%d} did not grow", ep))
	}
	if decision != "" && (field(decision, "tier") != "1.5" || field(decision, "ep") != strconv.Itoa(ep)) {
		problems = append(problems, "x-kvgate-decision: "+decision)
	}
	if engOK && engHits <= 0 {
		problems = append(problems, "the engine's vllm:prefix_cache_hits_total did not grow")
	}
	proof := fmt.Sprintf("%d predicted hashes stored by ep_idx %d; second request: tier-1.5 hits +%.0f", predicted, ep, hits)
	if engOK {
		proof += fmt.Sprintf(", engine prefix_cache_hits +%.0f", engHits)
	}
	if decision != "" {
		proof += ", x-kvgate-decision: " + decision
	} else {
		proof += " (x-kvgate-decision not sent: kvgate runs without --decision-header)"
	}
	if len(problems) > 0 {
		c.Result, c.Detail = Fail, proof+"; "+strings.Join(problems, "; ")
		c.Fix = "the guard ladder did not route the repeat to its cache: see loxilb_pd_kv_tier15_miss_reason_total for the reason"
		return c
	}
	c.Result, c.Detail = Pass, proof
	return c
}

// waitStored waits, bounded by InventoryWait, for a KV endpoint whose
// mirrored inventory holds every predicted hash; it returns that endpoint
// (-1: none) and the most predicted hashes any endpoint held.
func (r *Runner) waitStored(ctx context.Context, rule *config.Rule, facts []*endpointFacts, kv map[int]bool, want []uint64) (ep, stored int) {
	deadline := time.Now().Add(r.InventoryWait)
	for ctx.Err() == nil {
		for _, f := range facts {
			if !kv[f.ep.Idx] {
				continue
			}
			inv, _ := r.src.Inventory(rule.ServiceID, f.ep.Idx)
			n := countIn(inv, want)
			stored = max(stored, n)
			if n == len(want) {
				return f.ep.Idx, stored
			}
		}
		if time.Now().After(deadline) || r.allMismatched(rule, kv) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1, stored
}

// allMismatched reports whether every KV endpoint's last checked
// BlockStored differed from kvgate's hashes: the probe's blocks will not
// show up under the predicted hashes, so waiting longer is pointless.
func (r *Runner) allMismatched(rule *config.Rule, kv map[int]bool) bool {
	p := r.src.Parity(rule.ServiceID)
	if p == nil {
		return false
	}
	n := 0
	for _, s := range p.Status() {
		if kv[s.EPIdx] && s.Mismatches > 0 {
			n++
		}
	}
	return n == len(kv)
}

// probePrompt builds a unique prompt of at least 3 hashed blocks.
func (r *Runner) probePrompt(rule *config.Rule, model string) (string, []uint64, error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	var b strings.Builder
	b.WriteString("kvgate preflight probe " + hex.EncodeToString(nonce[:]) + ".")
	for i := 0; i < 64; i++ { // bounded: 64 sentences are ≫ 3 blocks of any sane block size
		fmt.Fprintf(&b, " Sentence %d of the probe %s checks that the cache is reused.", i, hex.EncodeToString(nonce[:2]))
		if i%4 != 3 {
			continue
		}
		hs, err := r.src.PredictHashes(rule.ServiceID, model, b.String())
		if err != nil {
			return "", nil, err
		}
		if len(hs) >= 3 {
			return b.String(), hs, nil
		}
	}
	return "", nil, errors.New("the probe prompt does not reach 3 blocks")
}

func countIn(inv, want []uint64) int {
	set := make(map[uint64]struct{}, len(inv))
	for _, h := range inv {
		set[h] = struct{}{}
	}
	n := 0
	for _, h := range want {
		if _, ok := set[h]; ok {
			n++
		}
	}
	return n
}

func (r *Runner) engineCounter(ctx context.Context, e config.Endpoint, name string) (float64, bool) {
	code, body, err := r.get(ctx, r.baseURL(e)+"/metrics")
	if err != nil || code != http.StatusOK {
		return 0, false
	}
	sum, found := 0.0, false
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, name) || len(line) <= len(name) || (line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		rest := line[len(name):]
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fs[0], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

func field(h, key string) string {
	for part := range strings.SplitSeq(h, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && k == key {
			return v
		}
	}
	return ""
}
