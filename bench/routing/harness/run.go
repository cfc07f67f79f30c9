package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Load is one offered load: open-loop Poisson at QPS, or closed-loop with
// Concurrency clients.
type Load struct {
	QPS         float64
	Concurrency int
}

// Kind is "qps" or "conc".
func (l Load) Kind() string {
	if l.Concurrency > 0 {
		return "conc"
	}
	return "qps"
}

// Value is the load's number.
func (l Load) Value() float64 {
	if l.Concurrency > 0 {
		return float64(l.Concurrency)
	}
	return l.QPS
}

// Point is one measurement: a policy on a fresh fleet replaying one trace.
type Point struct {
	Profile  Profile
	Seed     uint64
	Workload string
	Load     Load
	Policy   string
	Shape    Shape
	// RequestTimeout bounds each request; PointTimeout the whole point.
	RequestTimeout, PointTimeout time.Duration
	// TraceDir, when set, receives one CSV per point with every request.
	TraceDir string
}

// Key identifies a point in the CSV (resume skips finished keys).
func (p Point) Key() string {
	return fmt.Sprintf("%s|%d|%s|%s|%g|%s", p.Profile.Name, p.Seed, p.Workload, p.Load.Kind(), p.Load.Value(), p.Policy)
}

// Record is one request's outcome, measured by the client.
type Record struct {
	Start, End   time.Time
	TTFT, E2E    time.Duration
	Gaps         []time.Duration // between content-bearing SSE events
	Engine       string
	Decision     string        // x-kvgate-decision, when the front is kvgate
	EngineQueue  time.Duration // x-enginesim-queue-us: time the engine kept it waiting
	PromptTokens int
	CachedTokens int
	OutTokens    int
	Err          error
}

// Result is a point's summary, one CSV row.
type Result struct {
	Point
	Requests, Errors          int
	TTFTp50, TTFTp90, TTFTp99 float64 // seconds
	ITLp50, E2Ep90            float64
	OutTokPerS                float64
	PromptTokens, CachedTok   int
	CachedRatio               float64
	LoadMaxMean, ReqMaxMean   float64 // busiest engine ÷ mean: busy time, request count
	Duration                  float64
	FirstError                string
}

// RunPoint starts a fresh fleet and the policy, replays the trace and
// summarizes it.
func RunPoint(ctx context.Context, env *Env, pt Point) (Result, error) {
	if pt.RequestTimeout == 0 {
		pt.RequestTimeout = 2 * time.Minute
	}
	if pt.PointTimeout == 0 {
		pt.PointTimeout = 10 * time.Minute
	}
	trace, err := Generate(pt.Workload, pt.Shape, pt.Seed)
	if err != nil {
		return Result{}, err
	}
	if pt.Load.Concurrency == 0 {
		if pt.Load.QPS <= 0 {
			return Result{}, fmt.Errorf("load: QPS or concurrency must be positive")
		}
		// The offered rate is in model time; the engines run TimeScale
		// times slower, so the wall-clock rate is divided by it.
		trace = Poisson(trace, pt.Load.QPS/scale(pt.Profile), pt.Seed)
	}
	fleet, err := StartFleet(env, pt.Profile)
	if err != nil {
		return Result{}, err
	}
	defer fleet.Close()
	front, err := StartFront(ctx, env, fleet, pt.Profile, pt.Policy)
	if err != nil {
		return Result{}, err
	}
	defer front.Close()
	ctx, cancel := context.WithTimeout(ctx, pt.PointTimeout)
	defer cancel()
	if err := WarmUp(ctx, front.URL, fleet); err != nil {
		return Result{}, fmt.Errorf("%s: %w", pt.Policy, err)
	}
	recs := Replay(ctx, front.URL, trace, pt.Load.Concurrency, time.Duration(float64(pt.RequestTimeout)*scale(pt.Profile)))
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		env.Log.Warn("point hit its timeout", "point", pt.Key())
	}
	if pt.TraceDir != "" {
		if err := writeTrace(pt, trace, recs); err != nil {
			return Result{}, err
		}
	}
	return Summarize(pt, recs, len(fleet.Engines)), nil
}

// Replay sends the trace to base. conc > 0 runs closed-loop with conc
// clients (each takes the next request, a conversation's turns in order);
// otherwise each request leaves at its At offset. A conversation's turn waits
// for its previous turn in both modes.
func Replay(ctx context.Context, base string, trace []Request, conc int, reqTimeout time.Duration) []Record {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second}}
	defer client.CloseIdleConnections()
	rp := &replay{ctx: ctx, client: client, bases: frontBases(base), trace: trace, reqTimeout: reqTimeout,
		recs: make([]Record, len(trace)), done: make(map[turnKey]chan struct{}, len(trace))}
	for _, r := range trace {
		if r.Conv >= 0 {
			rp.done[turnKey{r.Conv, r.Turn}] = make(chan struct{})
		}
	}
	if conc > 0 {
		rp.closedLoop(conc)
	} else {
		rp.openLoop()
	}
	return rp.recs
}

// turnKey names one turn of a conversation.
type turnKey struct{ conv, turn int }

// replay is one Replay call's shared state: recs[i] is written only by the
// goroutine sending trace[i], and done[k] is closed once turn k finished.
type replay struct {
	ctx        context.Context
	client     *http.Client
	bases      []string // request i goes to bases[i mod len]: clients spread over replicas
	trace      []Request
	reqTimeout time.Duration
	recs       []Record
	done       map[turnKey]chan struct{}
}

// waitPrev waits for r's previous turn; false means ctx ended first.
func (rp *replay) waitPrev(r Request) bool {
	if r.Conv < 0 || r.Turn == 0 {
		return true
	}
	ch, ok := rp.done[turnKey{r.Conv, r.Turn - 1}]
	if !ok {
		return true
	}
	select {
	case <-ch:
		return true
	case <-rp.ctx.Done():
		return false
	}
}

// one sends trace[i] after its previous turn and records it.
func (rp *replay) one(i int) {
	r := rp.trace[i]
	defer func() {
		if r.Conv >= 0 {
			close(rp.done[turnKey{r.Conv, r.Turn}])
		}
	}()
	if !rp.waitPrev(r) {
		rp.recs[i] = Record{Err: rp.ctx.Err(), Start: time.Now(), End: time.Now()}
		return
	}
	rctx, cancel := context.WithTimeout(rp.ctx, rp.reqTimeout)
	rp.recs[i] = send(rctx, rp.client, rp.bases[i%len(rp.bases)], r)
	cancel()
}

// closedLoop runs conc clients. A client owns a whole conversation so its
// turns do not hold other clients hostage; requests left unsent when ctx
// ends are recorded as errors.
func (rp *replay) closedLoop(conc int) {
	units := map[int][]int{}
	var order []int
	for i, r := range rp.trace {
		k := r.Conv
		if k < 0 {
			k = -1 - i
		}
		if _, ok := units[k]; !ok {
			order = append(order, k)
		}
		units[k] = append(units[k], i)
	}
	var wg sync.WaitGroup
	jobs := make(chan []int)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range jobs {
				for _, i := range u {
					rp.one(i)
				}
			}
		}()
	}
feed:
	for _, k := range order {
		select {
		case jobs <- units[k]:
		case <-rp.ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	for i := range rp.recs {
		if rp.recs[i].Start.IsZero() {
			rp.recs[i] = Record{Err: errors.New("not sent: point timed out"), Start: time.Now(), End: time.Now()}
		}
	}
}

// openLoop starts each request at its At offset from now.
func (rp *replay) openLoop() {
	var wg sync.WaitGroup
	start := time.Now()
	for i := range rp.trace {
		if d := time.Until(start.Add(rp.trace[i].At)); d > 0 {
			select {
			case <-time.After(d):
			case <-rp.ctx.Done():
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); rp.one(i) }()
	}
	wg.Wait()
}

// send issues one streaming request and measures it from the client.
func send(ctx context.Context, c *http.Client, base string, r Request) (rec Record) {
	rec.Start = time.Now()
	defer func() { rec.End = time.Now(); rec.E2E = rec.End.Sub(rec.Start) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		rec.Err = err
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		rec.Err = err
		return rec
	}
	defer resp.Body.Close()
	rec.Engine = resp.Header.Get("x-engine-id")
	rec.Decision = resp.Header.Get("x-kvgate-decision")
	if us, err := strconv.ParseInt(resp.Header.Get("x-enginesim-queue-us"), 10, 64); err == nil {
		rec.EngineQueue = time.Duration(us) * time.Microsecond
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	// TTFT: the first body byte after the response head.
	if _, err := br.Peek(1); err != nil {
		rec.Err = fmt.Errorf("no body: %w", err)
		return rec
	}
	rec.TTFT = time.Since(rec.Start)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(br, 512))
		rec.Err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return rec
	}
	readStream(br, &rec)
	return rec
}

// readStream reads the SSE body into rec: usage, the gaps between chunks
// that carry text, and an error if the stream broke or lacked [DONE].
func readStream(br *bufio.Reader, rec *Record) {
	var last time.Time
	sawDone := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			sawDone = streamLine(line, rec, &last) || sawDone
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if !errors.Is(err, io.EOF) {
				rec.Err = err
			}
			break
		}
	}
	if rec.Err == nil && !sawDone {
		rec.Err = errors.New("stream ended without [DONE]")
	}
}

// streamLine handles one SSE line and reports whether it was [DONE]; a
// chunk with text adds the gap since the previous one (*last) to rec.
func streamLine(line []byte, rec *Record, last *time.Time) bool {
	now := time.Now()
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
	if !ok {
		return false
	}
	if string(data) == "[DONE]" {
		return true
	}
	if !parseChunk(data, rec) {
		return false
	}
	if !last.IsZero() {
		rec.Gaps = append(rec.Gaps, now.Sub(*last))
	}
	*last = now
	return false
}

// parseChunk reads usage into rec and reports whether the chunk carried text.
func parseChunk(data []byte, rec *Record) bool {
	var ch struct {
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			Details          *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(data, &ch) != nil {
		return false
	}
	if ch.Usage != nil {
		rec.PromptTokens = ch.Usage.PromptTokens
		rec.OutTokens = ch.Usage.CompletionTokens
		if ch.Usage.Details != nil {
			rec.CachedTokens = ch.Usage.Details.Cached
		}
	}
	for _, c := range ch.Choices {
		if c.Text != "" || c.Delta.Content != "" {
			return true
		}
	}
	return false
}

// Summarize turns records into a Result. Failed requests count as errors
// and stay out of the latency percentiles.
func Summarize(pt Point, recs []Record, engines int) Result {
	res := Result{Point: pt, Requests: len(recs)}
	// Wall-clock durations are model time × TimeScale.
	k := 1 / scale(pt.Profile)
	var ttft, e2e, gaps []float64
	busy := map[string]float64{}
	count := map[string]int{}
	var first, last time.Time
	outTok := 0
	for _, r := range recs {
		if first.IsZero() || (!r.Start.IsZero() && r.Start.Before(first)) {
			first = r.Start
		}
		if r.End.After(last) {
			last = r.End
		}
		if r.Err != nil {
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = r.Err.Error()
			}
			continue
		}
		ttft = append(ttft, k*r.TTFT.Seconds())
		e2e = append(e2e, k*r.E2E.Seconds())
		for _, g := range r.Gaps {
			gaps = append(gaps, k*g.Seconds())
		}
		res.PromptTokens += r.PromptTokens
		res.CachedTok += r.CachedTokens
		outTok += r.OutTokens
		busy[r.Engine] += k * r.E2E.Seconds()
		count[r.Engine]++
	}
	res.TTFTp50, res.TTFTp90, res.TTFTp99 = pct(ttft, 50), pct(ttft, 90), pct(ttft, 99)
	res.ITLp50, res.E2Ep90 = pct(gaps, 50), pct(e2e, 90)
	if res.PromptTokens > 0 {
		res.CachedRatio = float64(res.CachedTok) / float64(res.PromptTokens)
	}
	res.Duration = k * last.Sub(first).Seconds()
	if res.Duration > 0 {
		res.OutTokPerS = float64(outTok) / res.Duration
	}
	res.LoadMaxMean = maxOverMean(busy, engines)
	cf := map[string]float64{}
	for k, v := range count {
		cf[k] = float64(v)
	}
	res.ReqMaxMean = maxOverMean(cf, engines)
	return res
}

// maxOverMean is the busiest engine's share over the mean across all n
// engines (an engine that got nothing counts as zero).
func maxOverMean(m map[string]float64, n int) float64 {
	var sum, mx float64
	for _, v := range m {
		sum += v
		mx = max(mx, v)
	}
	if sum == 0 || n == 0 {
		return 0
	}
	return mx / (sum / float64(n))
}

// pct is the nearest-rank percentile; 0 for no samples.
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// firstLine trims an error for a CSV cell.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 160 {
		s = s[:160]
	}
	return strings.ReplaceAll(s, ",", ";")
}

// writeTrace dumps a point's requests for forensics (never committed).
func writeTrace(pt Point, trace []Request, recs []Record) error {
	name := strings.NewReplacer("|", "_", "@", "_", ".", "p").Replace(pt.Key()) + ".csv"
	f, err := os.Create(filepath.Join(pt.TraceDir, name))
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	w := csv.NewWriter(f)
	_ = w.Write([]string{"seq", "at_s", "kind", "conv", "turn", "start_s", "engine", "decision", "ttft_s", "engine_queue_s", "e2e_s", "prompt_tokens", "cached_tokens", "out_tokens", "error"})
	t0 := time.Time{}
	for _, r := range recs {
		if t0.IsZero() || (!r.Start.IsZero() && r.Start.Before(t0)) {
			t0 = r.Start
		}
	}
	for i, r := range recs {
		q := trace[i]
		e := ""
		if r.Err != nil {
			e = firstLine(r.Err.Error())
		}
		_ = w.Write([]string{strconv.Itoa(q.Seq), f4(q.At.Seconds()), q.Kind, strconv.Itoa(q.Conv), strconv.Itoa(q.Turn),
			f4(r.Start.Sub(t0).Seconds()), r.Engine, r.Decision, f4(r.TTFT.Seconds()), f4(r.EngineQueue.Seconds()), f4(r.E2E.Seconds()),
			strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CachedTokens), strconv.Itoa(r.OutTokens), e})
	}
	w.Flush()
	return w.Error()
}

// WarmUp sends one short completion and one short chat through the front,
// so lazily loaded state (kvgate loads a model's tokenizer and chat template
// on its first request) is ready as it would be in a running deployment,
// then empties every engine's prefix cache (POST /reset_prefix_cache, which
// also tells kvgate through an AllBlocksCleared event), so each policy
// starts from empty caches.
func WarmUp(ctx context.Context, base string, f *Fleet) error {
	c := &http.Client{Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	if err := warmFronts(ctx, c, frontBases(base)); err != nil {
		return err
	}
	return resetCaches(ctx, c, f)
}

// warmFronts sends the warm-up requests through every front (each replica
// loads its tokenizers lazily).
func warmFronts(ctx context.Context, c *http.Client, bases []string) error {
	for _, base := range bases {
		if err := warmFront(ctx, c, base); err != nil {
			return err
		}
	}
	return nil
}

func warmFront(ctx context.Context, c *http.Client, base string) error {
	for _, r := range []struct{ path, body string }{
		{PathCompletion, `{"model":"` + Model + `","prompt":"warm up","max_tokens":1}`},
		{PathChat, `{"model":"` + Model + `","messages":[{"role":"user","content":"warm up"}],"max_tokens":1}`},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.path, strings.NewReader(r.body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("warm-up %s: %w", r.path, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("warm-up %s: status %d: %.200s", r.path, resp.StatusCode, b)
		}
	}
	return nil
}

// resetCaches empties every engine's prefix cache.
func resetCaches(ctx context.Context, c *http.Client, f *Fleet) error {
	for _, u := range f.URLs() {
		// 503 means requests still hold blocks (vLLM refuses then): retry
		// briefly, the warm-up requests have finished.
		ok := false
		for range 50 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/reset_prefix_cache", nil)
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok = true
					break
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !ok {
			return fmt.Errorf("warm-up: %s/reset_prefix_cache did not succeed", u)
		}
	}
	// Let the AllBlocksCleared events reach kvgate before the trace starts.
	time.Sleep(100 * time.Millisecond)
	return nil
}

func scale(p Profile) float64 {
	if p.TimeScale > 0 {
		return p.TimeScale
	}
	return 1
}
