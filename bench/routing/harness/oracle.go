package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"
)

// EngineState is enginesim's GET /debug/state (only with --debug-state).
type EngineState struct {
	EngineID             string `json:"engine_id"`
	NowUnixNano          int64  `json:"now_unix_nano"`
	Running              int    `json:"running"`
	Waiting              int    `json:"waiting"`
	PendingPrefillTokens int    `json:"pending_prefill_tokens"`
	KVBlocksUsed         int    `json:"kv_blocks_used"`
	KVBlocksTotal        int    `json:"kv_blocks_total"`
	BlockSize            int    `json:"block_size"`
	Perf                 struct {
		Model                string  `json:"model"`
		StepFloorS           float64 `json:"step_floor_s"`
		PrefillSPerToken     float64 `json:"prefill_s_per_token"`
		DecodeSPerSeq        float64 `json:"decode_s_per_seq"`
		AttnSPerContextToken float64 `json:"attn_s_per_context_token"`
		MaxNumBatchedTokens  int     `json:"max_num_batched_tokens"`
		MaxNumSeqs           int     `json:"max_num_seqs"`
	} `json:"perf"`
	PredictedTTFTPer1k float64 `json:"predicted_ttft_s_for_new_tokens_per_1k"`
}

// MatchResult is enginesim's POST /debug/match.
type MatchResult struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
}

// PredictTTFT is the oracle's estimate of a new request's TTFT on an engine
// in state s when uncached of its tokens must be prefilled. vLLM V1's
// scheduler spends each step's token budget on decodes first and then on
// prefill chunks in arrival order, so the request's last prompt token is
// computed once everything pending ahead of it and its own uncached tokens
// have gone through; the engine reports the marginal cost of that work per
// 1,000 tokens at its current batch (predicted_ttft_s_for_new_tokens_per_1k:
// prefill cost plus the step overheads the leftover budget implies). At
// least one step is paid. A request that finds every sequence slot taken
// also waits about one step per request ahead of it.
func PredictTTFT(s EngineState, uncached int) float64 {
	work := float64(s.PendingPrefillTokens + max(uncached, 1))
	t := s.Perf.StepFloorS + work/1000*s.PredictedTTFTPer1k
	if s.Perf.MaxNumSeqs > 0 && s.Running+s.Waiting >= s.Perf.MaxNumSeqs {
		t += float64(s.Running+s.Waiting-s.Perf.MaxNumSeqs+1) * (s.Perf.StepFloorS + s.Perf.DecodeSPerSeq*float64(s.Running))
	}
	return t
}

// oracle sees every engine's true cache (POST /debug/match) and queue (GET
// /debug/state) and sends each request where the predicted TTFT is lowest.
// Picks run concurrently (serializing them made the oracle's own probing a
// queue on a loaded machine); a request it has just assigned counts as
// pending prefill on its engine for assignTTL, until the engine's own state
// shows it, so two concurrent picks do not both claim one idle engine.
type oracle struct {
	urls   []string
	client *http.Client
	mu     sync.Mutex
	recent [][]assigned // per engine
}

type assigned struct {
	tokens int
	until  time.Time
}

// assignTTL covers the proxy's forward to the engine (wall time).
const assignTTL = 50 * time.Millisecond

func newOracle(urls []string) *oracle {
	return &oracle{urls: urls, recent: make([][]assigned, len(urls)), client: &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

func (o *oracle) Name() string { return "oracle" }
func (o *oracle) Done(int)     {}
func (o *oracle) Close()       {}

func (o *oracle) Pick(r *PickRequest) int {
	n := len(o.urls)
	states := make([]EngineState, n)
	matches := make([]MatchResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range o.urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := o.getJSON(o.urls[i]+"/debug/state", nil, "", &states[i]); err != nil {
				errs[i] = err
				return
			}
			errs[i] = o.getJSON(o.urls[i]+"/debug/match", r.Body, r.Path, &matches[i])
		}()
	}
	wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	best, bestT := -1, math.Inf(1)
	for i := range o.urls {
		live := o.recent[i][:0]
		for _, a := range o.recent[i] {
			if a.until.After(now) {
				live = append(live, a)
				states[i].PendingPrefillTokens += a.tokens
			}
		}
		o.recent[i] = live
		if errs[i] != nil {
			continue
		}
		t := PredictTTFT(states[i], matches[i].PromptTokens-matches[i].CachedTokens)
		if t < bestT || (t == bestT && states[i].Running+states[i].Waiting < states[best].Running+states[best].Waiting) {
			best, bestT = i, t
		}
	}
	if best < 0 {
		return 0 // every probe failed: the request still goes somewhere and the error shows in its engine's answer
	}
	o.recent[best] = append(o.recent[best], assigned{tokens: max(matches[best].PromptTokens-matches[best].CachedTokens, 1), until: now.Add(assignTTL)})
	return best
}

func (o *oracle) getJSON(url string, body []byte, path string, v any) error {
	method := http.MethodGet
	if body != nil {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if path != "" {
		req.Header.Set("X-Debug-Path", path)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d (enginesim needs --debug-state): %.200s", url, resp.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// probeDebug checks that an engine serves the oracle hooks.
func probeDebug(c *http.Client, base string) error {
	resp, err := c.Get(base + "/debug/state")
	if err != nil {
		return fmt.Errorf("oracle: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("oracle: %s/debug/state answered %d: the engines need --debug-state (enginesim Config.DebugState)", base, resp.StatusCode)
	}
	return nil
}
