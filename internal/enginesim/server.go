package enginesim

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// notifyPath is where a simulated decoder tells the prefill engine it has
// read a request's blocks (enginesim only; real NIXL reads them over RDMA).
const notifyPath = "/enginesim/kv_transfer_done"

// Engine is one simulated vLLM engine: an OpenAI-compatible HTTP server, the
// prefix cache, the KV-event publisher and vLLM's metrics. Several engines
// can run in one process; each has its own sockets and metric registry.
type Engine struct {
	cfg        Config
	hasher     *groupHasher
	pool       *blockPool
	cpu        *cpuTier // nil unless NumCPUBlocks > 0
	metrics    *engineMetrics
	pub        *publisher
	layout     kvevents.Layout
	tok        Tokenizer
	outVocab   []uint32
	engineUUID string

	ln      net.Listener
	srv     *http.Server
	url     string
	created int64

	submit       chan *request
	abort        chan *request
	releaseLease chan string
	ctl          chan ctlMsg
	closing      chan struct{}
	loopDone     chan struct{}
	serveDone    chan struct{}
	closeOnce    sync.Once
	closeErr     error
	reqCounter   atomic.Uint64
	notifyClient *http.Client
	// dpRanks are attention-DP ranks 1..DPSize-1 (this engine is rank 0);
	// generation requests go round robin over all of them (sglang.go).
	dpRanks []*Engine
	dpNext  atomic.Uint64
	// drain holds TensorRT-LLM's KV events until POST /kv_cache_events
	// takes them (trtllm.go); nil for other engines.
	drain *trtDrain
	// lora holds the adapters loaded at run time (lora_runtime.go).
	lora runtimeLoRA
}

// New validates cfg, binds the HTTP listener and the KV-event sockets and
// starts serving. /health answers 200 as soon as New returns.
func New(cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	e := &Engine{
		cfg:          cfg,
		tok:          cfg.Tokenizer,
		engineUUID:   randomHex(16),
		created:      time.Now().Unix(),
		submit:       make(chan *request, 256),
		abort:        make(chan *request, 256),
		releaseLease: make(chan string, 256),
		ctl:          make(chan ctlMsg),
		closing:      make(chan struct{}),
		loopDone:     make(chan struct{}),
		serveDone:    make(chan struct{}),
		notifyClient: &http.Client{Timeout: 2 * time.Second},
	}
	if e.tok == nil {
		e.tok = byteTokenizer{}
	}
	e.outVocab = outputVocabulary(e.tok)
	e.layout, _ = parseEventLayout(cfg.EventLayout) // validated above
	hasher, err := newHasher(cfg)
	if err != nil {
		return nil, err
	}
	e.hasher = hasher
	if e.pool, err = newBlockPool(cfg.NumGPUBlocks); err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	e.cpu = newCPUTier(cfg.NumCPUBlocks)
	if cfg.Engine == EngineTRTLLM {
		e.drain = newTRTDrain(cfg.EventBufferMaxSize, cfg.NumGPUBlocks, cfg.MaxModelLen)
	}
	e.metrics = newEngineMetrics(cfg)

	e.ln, err = net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("enginesim: listen: %w", err)
	}
	port := e.ln.Addr().(*net.TCPAddr).Port
	scheme := "http"
	if cfg.SSLCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.SSLCertFile, cfg.SSLKeyFile)
		if err != nil {
			e.ln.Close()
			return nil, fmt.Errorf("enginesim: ssl-certfile/ssl-keyfile: %w", err)
		}
		e.ln = tls.NewListener(e.ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"}})
		scheme = "https"
	}
	e.url = scheme + "://" + net.JoinHostPort(cfg.Host, strconv.Itoa(port))
	if e.cfg.ID == "" {
		e.cfg.ID = net.JoinHostPort(cfg.Host, strconv.Itoa(port))
	}
	if cfg.KVEventsEndpoint != "none" {
		e.pub, err = newPublisher(cfg.Logger, cfg.KVEventsEndpoint, cfg.ReplayEndpoint, cfg.EventTopic, cfg.ReplayBuffer, cfg.ReplayLayout)
		if err != nil {
			e.ln.Close()
			return nil, fmt.Errorf("enginesim: %w", err)
		}
	}
	e.srv = &http.Server{
		Handler:           e.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          nil,
	}
	if scheme == "https" {
		// A tcp probe or a client with the wrong CA fails its handshake on
		// every try: at debug level, not on stderr each time.
		e.srv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
	}
	if err := e.startDPRanks(); err != nil {
		if e.pub != nil {
			e.pub.close()
		}
		e.ln.Close()
		return nil, err
	}
	go e.run()
	go func() {
		defer close(e.serveDone)
		if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Error("enginesim: serve", "err", err)
		}
	}()
	cfg.Logger.Info("enginesim engine started", "id", e.cfg.ID, "url", e.url, "role", cfg.Role,
		"model", cfg.Model, "block_size", cfg.BlockSize, "hash_algo", cfg.HashAlgo,
		"num_gpu_blocks", cfg.NumGPUBlocks, "perf_model", cfg.PerfModel, "max_num_seqs", cfg.MaxNumSeqs,
		"max_num_batched_tokens", cfg.MaxNumBatchedTokens, "kv_events", e.EventsEndpoint(), "replay", e.ReplayEndpoint())
	return e, nil
}

// newHasher builds the block hasher; with the xxhash algorithms and
// PYTHONHASHSEED unset it draws a random NONE_HASH seed as vLLM does.
func newHasher(cfg Config) (*groupHasher, error) {
	algo, err := kvhash.ParseAlgo(cfg.HashAlgo)
	if err != nil {
		return nil, fmt.Errorf("enginesim: prefix-caching-hash-algo: %w", err)
	}
	seed := kvhash.Seed{}
	if cfg.HashSeedSet {
		seed = kvhash.SeedOf(cfg.PythonHashSeed)
	}
	hb := cfg.HashBlockSize
	if hb == 0 {
		hb = cfg.BlockSize
	}
	h, err := kvhash.New(kvhash.Contract{Algo: algo, BlockSize: hb, Seed: seed})
	if errors.Is(err, kvhash.ErrUnsetSeed) {
		// vLLM: NONE_HASH = hash_fn(os.urandom(32).hex()).
		cfg.Logger.Warn("PYTHONHASHSEED is unset with an xxhash algorithm: NONE_HASH is random, so no router can reproduce this engine's block hashes (parity is impossible); set PYTHONHASHSEED", "algo", algo)
		h, err = kvhash.New(kvhash.Contract{Algo: algo, BlockSize: hb, Seed: kvhash.SeedOf(randomHex(32))})
	}
	if err != nil {
		return nil, fmt.Errorf("enginesim: block hasher: %w", err)
	}
	return newGroupHasher(h, cfg.BlockSize, hb)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// URL is the engine's base URL, e.g. http://127.0.0.11:8000.
func (e *Engine) URL() string { return e.url }

// ID is the value of the x-engine-id header.
func (e *Engine) ID() string { return e.cfg.ID }

// EventsEndpoint is the bound PUB endpoint ("none" when disabled).
func (e *Engine) EventsEndpoint() string {
	if e.pub == nil {
		return "none"
	}
	return "tcp://" + e.pub.pubAddr.String()
}

// ReplayEndpoint is the bound replay ROUTER endpoint ("none" when disabled).
func (e *Engine) ReplayEndpoint() string {
	if e.pub == nil || e.pub.replayAddr == nil {
		return "none"
	}
	return "tcp://" + e.pub.replayAddr.String()
}

// Close stops serving, fails requests in flight and releases every socket.
// It is safe to call more than once.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		close(e.closing)
		<-e.loopDone
		if err := e.srv.Shutdown(ctx); err != nil {
			e.srv.Close()
		}
		<-e.serveDone
		if e.pub != nil {
			e.closeErr = e.pub.close()
		}
		for _, r := range e.dpRanks {
			if err := r.Close(); err != nil && e.closeErr == nil {
				e.closeErr = err
			}
		}
	})
	return e.closeErr
}

func (e *Engine) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.handleGeneration(e.completionParams))
	mux.HandleFunc("POST /v1/chat/completions", e.handleGeneration(e.chatParams))
	mux.HandleFunc("POST /v1/responses", e.handleConversation(kindResponses, e.responsesParams))
	mux.HandleFunc("POST /v1/messages", e.handleConversation(kindMessages, e.messagesParams))
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "enginesim"})
	})
	mux.HandleFunc("POST /tokenize", e.handleTokenize)
	switch e.cfg.Engine {
	case EngineSGLang:
		mux.HandleFunc("GET /get_server_info", e.handleServerInfo)
	case EngineTRTLLM:
		mux.HandleFunc("POST /kv_cache_events", e.handleDrain)
		mux.HandleFunc("GET /server_info", e.handleTRTServerInfo)
	}
	mux.HandleFunc("POST /reset_prefix_cache", e.handleReset)
	if e.cfg.RuntimeLoRA {
		mux.HandleFunc("POST /v1/load_lora_adapter", e.handleLoadLoRA)
		mux.HandleFunc("POST /v1/unload_lora_adapter", e.handleUnloadLoRA)
	}
	mux.HandleFunc("POST "+notifyPath, e.handleNotify)
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.metrics.registry, promhttp.HandlerOpts{}))
	if e.cfg.DebugState {
		mux.HandleFunc("GET /debug/state", e.handleDebugState)
		mux.HandleFunc("POST /debug/match", e.handleDebugMatch)
	}
	keys := newAPIKeys(e.cfg.APIKeys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-engine-id", e.cfg.ID)
		if keys.refuses(r) {
			writeUnauthorized(w)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, e.cfg.MaxRequestBytes)
		if h, pattern := mux.Handler(r); pattern == "" {
			// The mux's own 404/405: answer in vLLM's JSON error shape.
			rec := &statusRecorder{header: http.Header{}}
			h.ServeHTTP(rec, r)
			typ := "NotFoundError"
			if rec.status == http.StatusMethodNotAllowed {
				typ = "MethodNotAllowedError"
				w.Header().Set("Allow", rec.header.Get("Allow"))
			}
			writeError(w, &badRequest{status: rec.status, typ: typ, msg: http.StatusText(rec.status)})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// writeError writes vLLM's error body: {"error": {message, type, param, code}}.
func writeError(w http.ResponseWriter, b *badRequest) {
	writeJSON(w, b.status, map[string]any{"error": map[string]any{
		"message": b.msg, "type": b.typ, "param": nil, "code": b.status,
	}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding failed","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// decodeBody reads a JSON request body with the size bound.
func decodeBody(r *http.Request, v any) *badRequest {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &badRequest{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		}
		return invalid("reading request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return invalid("invalid JSON body: %v", err)
	}
	return nil
}

// checkModel accepts the served model or one of its LoRA adapters
// (--lora-modules); lora is the adapter's name, which vLLM puts in every
// block's extra keys and in the events' lora_name.
func (e *Engine) checkModel(model string) (lora string, bad *badRequest) {
	if model == "" || model == e.cfg.Model {
		return "", nil
	}
	if slices.Contains(e.cfg.LoRAModules, model) || e.lora.has(model) {
		return model, nil
	}
	return "", &badRequest{status: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

func (e *Engine) checkVocab(ids []uint32) *badRequest {
	v := e.tok.VocabSize()
	if v <= 0 {
		return nil
	}
	for _, id := range ids {
		if int(id) >= v {
			return invalid("Token id %d is out of vocabulary", id)
		}
	}
	return nil
}

// genParams are the parsed, validated knobs common to both endpoints.
type genParams struct {
	kind         string // "cmpl" or "chatcmpl"
	prompt       []uint32
	extra        kvhash.Extra
	maxTokens    int
	stream       bool
	includeUsage bool
	kvParams     map[string]any
}

func (e *Engine) resolveMaxTokens(promptLen int, maxTokens, minTokens, n *int) (int, *badRequest) {
	if n != nil && *n != 1 {
		return 0, invalid("enginesim supports n=1 only, got n=%d", *n)
	}
	if promptLen >= e.cfg.MaxModelLen {
		return 0, invalid("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", e.cfg.MaxModelLen, promptLen)
	}
	mt := min(e.cfg.DefaultMaxTokens, e.cfg.MaxModelLen-promptLen)
	if maxTokens != nil {
		if *maxTokens < 1 {
			return 0, invalid("max_tokens must be at least 1, got %d.", *maxTokens)
		}
		mt = *maxTokens
	}
	if promptLen+mt > e.cfg.MaxModelLen {
		return 0, invalid("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", e.cfg.MaxModelLen, promptLen+mt, promptLen, mt)
	}
	if minTokens != nil && (*minTokens < 0 || *minTokens > mt) {
		return 0, invalid("min_tokens must be in [0, max_tokens=%d], got %d.", mt, *minTokens)
	}
	return mt, nil
}

// generationBody is a completions or chat request body.
type generationBody interface {
	generation() generationRequest
}

// admitGeneration decodes a completions or chat body into req and runs the
// checks both endpoints make before the prompt: the model (or a LoRA adapter
// on it) and stream options.
func (e *Engine) admitGeneration(r *http.Request, req generationBody) (g generationRequest, lora string, bad *badRequest) {
	if b := decodeBody(r, req); b != nil {
		return g, "", b
	}
	g = req.generation()
	lora, b := e.checkModel(g.Model)
	if b != nil {
		return g, "", b
	}
	if g.StreamOptions != nil && !g.Stream {
		return g, "", invalid("Stream options can only be defined when `stream=True`.")
	}
	return g, lora, nil
}

// generationParams bounds the output length for prompt ids and collects
// what generate needs.
func (e *Engine) generationParams(kind string, ids []uint32, g generationRequest, lora string) (genParams, *badRequest) {
	mt, b := e.resolveMaxTokens(len(ids), g.MaxTokens, g.MinTokens, g.N)
	if b != nil {
		return genParams{}, b
	}
	p := genParams{kind: kind, prompt: ids, maxTokens: mt, stream: g.Stream, kvParams: g.KVTransferParams}
	if g.StreamOptions != nil {
		p.includeUsage = g.StreamOptions.IncludeUsage
	}
	p.extra.LoRAName = lora
	if id, ok := e.cfg.LoRATaskIDs[lora]; ok && lora != "" && e.cfg.Engine == EngineTRTLLM {
		p.extra.LoRATaskID, p.extra.HasLoRATaskID = id, true
	}
	if g.CacheSalt != nil {
		p.extra.CacheSalt = *g.CacheSalt
	}
	return p, nil
}

// handleGeneration serves /v1/completions and /v1/chat/completions: parse
// turns the request into generation parameters or a vLLM-shaped error.
func (e *Engine) handleGeneration(parse func(*http.Request) (genParams, *badRequest)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, b := parse(r)
		if b != nil {
			writeError(w, b)
			return
		}
		e.pickRank(w).generate(w, r, p)
	}
}

// handleConversation serves /v1/responses and /v1/messages (apis.go):
// errors take the endpoint's own shape.
func (e *Engine) handleConversation(kind string, parse func(*http.Request) (genParams, *badRequest)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, b := parse(r)
		if b != nil {
			writeAPIError(w, kind, b)
			return
		}
		e.pickRank(w).generate(w, r, p)
	}
}

func (e *Engine) completionParams(r *http.Request) (genParams, *badRequest) {
	var req completionRequest
	g, lora, b := e.admitGeneration(r, &req)
	if b != nil {
		return genParams{}, b
	}
	text, ids, isText, b := parsePrompt(req.Prompt)
	if b != nil {
		return genParams{}, b
	}
	if isText {
		addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		var err error
		if ids, err = e.tok.EncodePrompt(text, addSpecial); err != nil {
			return genParams{}, invalid("tokenizing prompt: %v", err)
		}
	}
	if b := e.checkVocab(ids); b != nil {
		return genParams{}, b
	}
	return e.generationParams("cmpl", ids, g, lora)
}

func (e *Engine) chatParams(r *http.Request) (genParams, *badRequest) {
	var req chatRequest
	g, lora, b := e.admitGeneration(r, &req)
	if b != nil {
		return genParams{}, b
	}
	// Shape check (vLLM's pydantic validation); the template sees the raw messages.
	if _, b := parseMessages(req.Messages); b != nil {
		return genParams{}, b
	}
	creq := ChatRequest{
		Messages:             req.Messages,
		Tools:                req.Tools,
		AddGenerationPrompt:  req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		ChatTemplate:         req.ChatTemplate,
		ChatTemplateKwargs:   req.ChatTemplateKwargs,
		AddSpecialTokens:     req.AddSpecialTokens,
	}
	if creq.AddGenerationPrompt && creq.ContinueFinalMessage {
		return genParams{}, invalid("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	ids, _, err := e.tok.EncodeChat(creq)
	if err != nil {
		return genParams{}, invalid("applying chat template: %v", err)
	}
	return e.generationParams("chatcmpl", ids, g, lora)
}

// acceptRemote checks kv_transfer_params from a prefill engine the way
// NixlConnector does: all of remote_block_ids, remote_engine_id,
// remote_request_id, remote_host and remote_port must be present.
func acceptRemote(params map[string]any) (*remoteKV, bool) {
	if params == nil {
		return nil, false
	}
	if v, _ := params["do_remote_prefill"].(bool); !v {
		return nil, false
	}
	for _, k := range []string{"remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port"} {
		if params[k] == nil {
			return nil, false
		}
	}
	rk := &remoteKV{}
	rk.engineID, _ = params["remote_engine_id"].(string)
	rk.requestID, _ = params["remote_request_id"].(string)
	rk.notifyURL, _ = params["enginesim_notify_url"].(string)
	return rk, true
}

func (e *Engine) generate(w http.ResponseWriter, hr *http.Request, p genParams) {
	base := hr.Header.Get("X-Request-Id")
	if base == "" || len(base) > 128 {
		base = randomHex(16)
	}
	publicID := p.kind + "-" + base
	internalID := publicID + "-" + strconv.FormatUint(e.reqCounter.Add(1), 36)

	ctx := hr.Context()
	req, err := e.newRequest(ctx, internalID, p.prompt, p.extra, p.maxTokens)
	if err != nil {
		writeError(w, invalid("%v", err))
		return
	}
	if e.cfg.Role != RoleDecode {
		if v, _ := p.kvParams["do_remote_decode"].(bool); v {
			req.doRemoteDecode = true
		}
	}
	if e.cfg.Role != RolePrefill && p.kvParams != nil {
		if rk, ok := acceptRemote(p.kvParams); ok {
			req.remote = rk
			e.notifyPrefill(rk)
		} else if v, _ := p.kvParams["do_remote_prefill"].(bool); v {
			e.cfg.Logger.Warn("Got invalid KVTransferParams; computing the prompt locally", "request_id", publicID)
		}
	}
	if err := e.enqueue(ctx, req); err != nil {
		writeError(w, &badRequest{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		return
	}
	resp := responder{e: e, w: w, p: p, id: publicID, created: time.Now().Unix()}
	for {
		select {
		case <-req.out.signal:
		case <-ctx.Done():
			e.cancel(req)
			return
		}
		for _, out := range req.out.take() {
			if out.accepted {
				// The loop answers a submit at once, so a refusal (queue
				// full, shutting down) still gets its status. vLLM's server
				// returns a StreamingResponse as soon as the request is
				// queued: the status and headers reach the client now and
				// the first token later, so TTFT is the first body byte
				// after the head.
				if p.stream {
					resp.startStream()
				}
				continue
			}
			if done := resp.handle(req, out); done {
				return
			}
		}
	}
}

// notifyPrefill tells a simulated prefill engine that its blocks were read,
// so it unpins them now rather than at the lease timeout. Only enginesim
// prefill engines send a notify URL; it must be plain http to the host named
// in remote_host.
func (e *Engine) notifyPrefill(rk *remoteKV) {
	if rk.notifyURL == "" {
		return
	}
	u, err := url.Parse(rk.notifyURL)
	if err != nil || u.Scheme != "http" || u.Path != notifyPath {
		return
	}
	body, _ := json.Marshal(map[string]string{"remote_request_id": rk.requestID})
	go func() {
		resp, err := e.notifyClient.Post(rk.notifyURL, "application/json", strings.NewReader(string(body)))
		if err != nil {
			e.cfg.Logger.Debug("kv transfer notify failed", "url", rk.notifyURL, "err", err)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
	}()
}

func (e *Engine) handleNotify(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RemoteRequestID string `json:"remote_request_id"`
	}
	if b := decodeBody(r, &body); b != nil {
		writeError(w, b)
		return
	}
	select {
	case e.releaseLease <- body.RemoteRequestID:
	case <-e.closing:
	case <-r.Context().Done():
	}
	w.WriteHeader(http.StatusOK)
}

// responder turns step outputs into the OpenAI response (JSON or SSE).
type responder struct {
	e       *Engine
	w       http.ResponseWriter
	p       genParams
	id      string
	created int64

	started      bool
	tokens       []uint32
	seq          int    // Responses API event sequence number
	text         string // streamed text so far (Responses API done events)
	prefixOffset int
	readOffset   int
	cachedTokens int
}

// modelHeaders carry the model's own figures; a streamed response sends
// them as trailers, because its head leaves before the first token.
var modelHeaders = []string{"x-enginesim-ttft-us", "x-enginesim-queue-us", "x-enginesim-cached-tokens"}

func (rs *responder) setModelHeaders(out stepOutput) {
	h := rs.w.Header()
	h.Set(modelHeaders[0], strconv.FormatInt(out.ttft.Microseconds(), 10))
	h.Set(modelHeaders[1], strconv.FormatInt(out.queueTime.Microseconds(), 10))
	h.Set(modelHeaders[2], strconv.Itoa(out.cachedTokens))
}

// startStream writes a streamed response's status and headers.
func (rs *responder) startStream() {
	rs.started = true
	h := rs.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("Trailer", strings.Join(modelHeaders, ", "))
	rs.w.WriteHeader(http.StatusOK)
	if f, ok := rs.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (rs *responder) usage() *usage {
	u := &usage{
		PromptTokens:     len(rs.p.prompt),
		CompletionTokens: len(rs.tokens),
		TotalTokens:      len(rs.p.prompt) + len(rs.tokens),
	}
	if !rs.e.cfg.DisablePromptTokensDetails {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: rs.cachedTokens}
	}
	return u
}

// handle processes one output; it returns true when the response is done.
func (rs *responder) handle(req *request, out stepOutput) bool {
	if out.err != nil {
		status := http.StatusServiceUnavailable
		if !rs.started {
			writeError(rs.w, &badRequest{status: status, typ: "ServiceUnavailableError", msg: out.err.Error()})
		} else if rs.p.stream {
			rs.sse(map[string]any{"error": map[string]any{"message": out.err.Error(), "type": "ServiceUnavailableError", "param": nil, "code": status}})
			rs.sseDone()
		}
		return true
	}
	if out.first {
		rs.cachedTokens = out.cachedTokens
		rs.setModelHeaders(out)
	}
	rs.tokens = append(rs.tokens, out.tokens...)
	conversation := rs.p.kind == kindResponses || rs.p.kind == kindMessages
	if rs.p.stream {
		if conversation {
			return rs.handleConversationStream(out)
		}
		return rs.handleStream(out)
	}
	if !out.finished {
		return false
	}
	reason := out.finishReason
	text := rs.e.tok.Decode(rs.tokens)
	switch {
	case conversation:
		rs.writeConversationResponse(reason, text, out.kvTransferParams)
	case rs.p.kind == "chatcmpl":
		writeJSON(rs.w, http.StatusOK, chatResponse{
			ID: rs.id, Object: "chat.completion", Created: rs.created, Model: rs.e.cfg.Model,
			Choices: []chatChoice{{Message: chatMessageOut{Role: "assistant", Content: text, ToolCalls: []any{}}, FinishReason: &reason}},
			Usage:   rs.usage(), KVTransferParams: out.kvTransferParams,
		})
	default:
		writeJSON(rs.w, http.StatusOK, completionResponse{
			ID: rs.id, Object: "text_completion", Created: rs.created, Model: rs.e.cfg.Model,
			Choices: []completionChoice{{Text: text, FinishReason: &reason}},
			Usage:   rs.usage(), KVTransferParams: out.kvTransferParams,
		})
	}
	return true
}

// handleStream sends one output of a streamed response as SSE chunks; it
// returns true when the stream is done.
func (rs *responder) handleStream(out stepOutput) bool {
	if !rs.started {
		rs.startStream()
	}
	if out.first && rs.p.kind == "chatcmpl" {
		// vLLM sends the role chunk with the first output, not with the head.
		rs.sse(chatStreamChunk{ID: rs.id, Object: "chat.completion.chunk", Created: rs.created, Model: rs.e.cfg.Model,
			Choices: []chatStreamChoice{{Delta: chatDelta{Role: "assistant", Content: ""}}}})
	}
	if len(out.tokens) > 0 {
		rs.sseText(rs.delta(), nil)
	}
	if out.finished {
		reason := out.finishReason
		rs.sseText("", &reason)
		if rs.p.includeUsage {
			if rs.p.kind == "chatcmpl" {
				rs.sse(chatStreamChunk{ID: rs.id, Object: "chat.completion.chunk", Created: rs.created, Model: rs.e.cfg.Model, Choices: []chatStreamChoice{}, Usage: rs.usage()})
			} else {
				rs.sse(completionStreamChunk{ID: rs.id, Object: "text_completion", Created: rs.created, Model: rs.e.cfg.Model, Choices: []completionChoice{}, Usage: rs.usage()})
			}
		}
		rs.sseDone()
		return true
	}
	return false
}

// delta is vLLM's incremental detokenization: decode a short window and emit
// the new text once it no longer ends in an incomplete character.
func (rs *responder) delta() string {
	prefix := rs.e.tok.Decode(rs.tokens[rs.prefixOffset:rs.readOffset])
	full := rs.e.tok.Decode(rs.tokens[rs.prefixOffset:])
	if len(full) > len(prefix) && !strings.HasSuffix(full, "\uFFFD") && strings.HasPrefix(full, prefix) {
		rs.prefixOffset, rs.readOffset = rs.readOffset, len(rs.tokens)
		return full[len(prefix):]
	}
	return ""
}

func (rs *responder) sseText(text string, finish *string) {
	if rs.p.kind == "chatcmpl" {
		c := chatStreamChoice{Delta: chatDelta{Content: text}, FinishReason: finish}
		rs.sse(chatStreamChunk{ID: rs.id, Object: "chat.completion.chunk", Created: rs.created, Model: rs.e.cfg.Model, Choices: []chatStreamChoice{c}})
		return
	}
	rs.sse(completionStreamChunk{ID: rs.id, Object: "text_completion", Created: rs.created, Model: rs.e.cfg.Model,
		Choices: []completionChoice{{Text: text, FinishReason: finish}}})
}

func (rs *responder) sse(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = rs.w.Write([]byte("data: "))
	_, _ = rs.w.Write(b)
	_, _ = rs.w.Write([]byte("\n\n"))
	if f, ok := rs.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (rs *responder) sseDone() {
	_, _ = rs.w.Write([]byte("data: [DONE]\n\n"))
	if f, ok := rs.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	data := []any{map[string]any{
		"id": e.cfg.Model, "object": "model", "created": e.created, "owned_by": "vllm",
		"root": e.cfg.Model, "parent": nil, "max_model_len": e.cfg.MaxModelLen,
	}}
	for _, name := range append(slices.Clone(e.cfg.LoRAModules), e.lora.list()...) {
		// vLLM lists each adapter with its base model as parent.
		data = append(data, map[string]any{
			"id": name, "object": "model", "created": e.created, "owned_by": "vllm",
			"root": name, "parent": e.cfg.Model, "max_model_len": e.cfg.MaxModelLen,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if b := decodeBody(r, &req); b != nil {
		writeError(w, b)
		return
	}
	// An adapter tokenizes like its base model.
	if _, b := e.checkModel(req.Model); b != nil {
		writeError(w, b)
		return
	}
	var ids []uint32
	var err error
	switch {
	case req.Prompt != nil && len(req.Messages) > 0:
		writeError(w, invalid("give either prompt or messages, not both"))
		return
	case req.Prompt != nil:
		ids, err = e.tok.EncodePrompt(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	case len(req.Messages) > 0:
		if _, perr := parseMessages(req.Messages); perr != nil {
			writeError(w, perr)
			return
		}
		ids, _, err = e.tok.EncodeChat(ChatRequest{
			Messages:             req.Messages,
			Tools:                req.Tools,
			AddGenerationPrompt:  req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
			ContinueFinalMessage: req.ContinueFinalMsg,
			ChatTemplate:         req.ChatTemplate,
			ChatTemplateKwargs:   req.ChatTemplateKwargs,
			AddSpecialTokens:     req.AddSpecialTokens != nil && *req.AddSpecialTokens,
		})
	default:
		writeError(w, invalid("prompt or messages is required"))
		return
	}
	if err != nil {
		writeError(w, invalid("tokenizing: %v", err))
		return
	}
	if ids == nil {
		ids = []uint32{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": e.cfg.MaxModelLen, "tokens": ids, "token_strs": nil})
}

func (e *Engine) handleReset(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := e.resetPrefixCache(ctx); err != nil {
		status := http.StatusServiceUnavailable
		writeError(w, &badRequest{status: status, typ: "ServiceUnavailableError", msg: "Failed to reset prefix cache: " + err.Error()})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// EventSubscriptions lists the topic prefixes of the subscribers connected to
// the KV-event PUB socket (one "" per catch-all subscriber, deduplicated), so
// a caller can wait for a subscriber before sending traffic.
func (e *Engine) EventSubscriptions() []string {
	if e.pub == nil {
		return nil
	}
	return e.pub.topics()
}

// statusRecorder captures the status (and headers) of the mux's fallback
// handlers without writing them.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header { return s.header }

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return len(b), nil
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
}
