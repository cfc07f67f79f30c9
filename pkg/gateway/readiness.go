package gateway

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// maxPreload bounds how many staged tokenizers one scan queues: the pool
// tracks at most 256 models by default, so preloading more would only evict.
const maxPreload = 256

// preloader loads the staged tokenizers in the background at start and when
// a rule is created, so the first requests do not all wait on a cold load (a
// Qwen3 tokenizer takes about a second), and reports readiness: ready once
// every queued model's first load has finished, successfully or not (a
// broken file is logged by the pool and must not hold readiness forever). A
// model a rule names but that is not staged is never queued, so it cannot
// block readiness. See docs/api.md "Readiness".
//
// Parsing a tokenizer.json leaves about twice the loaded tokenizer as
// garbage (≈ 30 MB for Qwen3), which an idle daemon would keep resident for
// minutes, so once the queue is empty after a load the preloader asks for
// one release of freed memory (release; the daemon's ingest.MemReleaser,
// coalesced with ingest's and bounded to one a second; docs/ingest.md,
// "End to end").
type preloader struct {
	pool     *tokenizer.Pool
	dir      string
	log      *slog.Logger
	setGauge func(ready bool)
	release  func() // nil: never

	mu      sync.Mutex
	pending map[string]bool // queued or loading, by model name
	seen    map[string]bool // queued once already (a reload is the pool's job)
	queue   []string
	wake    chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newPreloader(pool *tokenizer.Pool, dir string, log *slog.Logger, setGauge func(bool), release func(), guard *recovery.Guard) *preloader {
	if dir == "" {
		dir = tokenizer.DefaultDir
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &preloader{pool: pool, dir: dir, log: log, setGauge: setGauge, release: release,
		pending: map[string]bool{}, seen: map[string]bool{}, wake: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	p.setGauge(true)
	guard.Go(recovery.Poller, p.run)
	return p
}

// Ready implements api.Readiness.
func (p *preloader) Ready() (bool, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return true, nil
	}
	out := make([]string, 0, len(p.pending))
	for m := range p.pending {
		out = append(out, m)
	}
	return false, out
}

// scan queues every model staged under the directory (<dir>/<slug>/tokenizer.json)
// plus extra models a rule names, when they are staged.
func (p *preloader) scan(extra ...string) {
	var models []string
	entries, err := os.ReadDir(p.dir)
	if err != nil && !os.IsNotExist(err) {
		p.log.Warn("tokenizer staging directory unreadable; nothing preloaded", "dir", p.dir, "err", err)
	}
	for _, e := range entries {
		models = append(models, strings.ReplaceAll(e.Name(), "__", "/")) // tokenizer.Slug reversed
	}
	models = append(models, extra...)
	p.mu.Lock()
	defer p.mu.Unlock()
	queued := 0
	for _, m := range models {
		if p.seen[m] || m == "" {
			continue
		}
		if _, err := os.Stat(p.pool.Path(m)); err != nil {
			continue // not staged: requests for it take the tokenize fallback
		}
		if len(p.seen) >= maxPreload {
			p.log.Warn("more staged tokenizers than kvgate preloads; the rest load on first use", "limit", maxPreload)
			break
		}
		p.seen[m], p.pending[m] = true, true
		p.queue = append(p.queue, m)
		queued++
	}
	if queued > 0 {
		p.setGauge(false)
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// ruleCreated queues what a new rule may need: anything staged since the
// last scan and its LoRA adapters' base models.
func (p *preloader) ruleCreated(r *config.Rule) {
	var extra []string
	for _, a := range r.LoraAdapters() {
		extra = append(extra, a.TokenizerModel)
	}
	p.scan(extra...)
}

// run loads one model at a time: loads are CPU-bound and the data plane
// shares the cores.
func (p *preloader) run() {
	defer close(p.done)
	loaded := false // since the last release
	for {
		p.mu.Lock()
		var m string
		if len(p.queue) > 0 {
			m, p.queue = p.queue[0], p.queue[1:]
		}
		p.mu.Unlock()
		if m == "" {
			if loaded && p.release != nil {
				p.release()
			}
			loaded = false
			select {
			case <-p.wake:
				continue
			case <-p.ctx.Done():
				return
			}
		}
		if p.ctx.Err() != nil {
			return
		}
		start := time.Now()
		loaded = true // a failed parse leaves garbage too
		if _, err := p.pool.Get(m); err != nil {
			// The pool logs the failure itself; this line only times the attempt.
			p.log.Debug("tokenizer preload failed", "model", m, "reason", tokenizer.ErrorReason(err), "took", time.Since(start))
		} else {
			p.log.Debug("tokenizer preloaded", "model", m, "took", time.Since(start))
		}
		p.mu.Lock()
		delete(p.pending, m)
		if len(p.pending) == 0 {
			p.setGauge(true)
		}
		p.mu.Unlock()
	}
}

// close stops the loader after the load in progress, if any.
func (p *preloader) close() {
	p.cancel()
	<-p.done
}
