package tokenizer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDir is where operators stage tokenizers: <DefaultDir>/<slug>/tokenizer.json.
const DefaultDir = "/etc/loxilb/tokenizers"

// Slug turns a model name into its staging directory name: every "/" becomes
// "__", nothing else changes (case is kept).
func Slug(model string) string { return strings.ReplaceAll(model, "/", "__") }

// ErrBadModelName is returned for a model name that cannot name a staging
// directory (empty, too long, "." or "..", a NUL or a backslash).
var ErrBadModelName = errors.New("tokenizer: model name cannot be a staging directory")

// PoolObserver receives the pool's events; the daemon wires it to metrics.
// Methods must be cheap and must not block.
type PoolObserver interface {
	// TokenizerLoaded: a tokenizer was (re)loaded in d (feeds a load counter
	// and a load-duration histogram).
	TokenizerLoaded(model string, reload bool, d time.Duration)
	// TokenizerLoadFailed: a load failed (feeds a failure counter by reason:
	// not_found, unsupported, parse, other; see ErrorReason).
	TokenizerLoadFailed(model string, err error)
}

// ErrorReason classifies a Get/Load error for metrics and logs: "not_found",
// "unsupported", "parse", "bad_name" or "other".
func ErrorReason(err error) string {
	var unsup *UnsupportedError
	var perr *ParseError
	switch {
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.As(err, &unsup):
		return "unsupported"
	case errors.As(err, &perr):
		return "parse"
	case errors.Is(err, ErrBadModelName):
		return "bad_name"
	}
	return "other"
}

// Pool loads models lazily by name from a staging directory and shares them
// across goroutines. A staged file that changes is reloaded (the old model is
// served until the new one loads); a failed load is retried after a bounded
// backoff, or at once when the files change. It never fetches over the network.
type Pool struct {
	dir        string
	check      time.Duration
	backoffMin time.Duration
	backoffMax time.Duration
	maxEntries int
	tokOpts    []Option
	observer   PoolObserver
	log        *slog.Logger
	now        func() time.Time

	mu      sync.RWMutex
	entries map[string]*poolEntry
}

// freshModel is a loaded model and until when it needs no stat: Get's
// lock-free fast path.
type freshModel struct {
	model *Model
	until time.Time
}

type poolEntry struct {
	mu        sync.Mutex // serialises first loads of this model
	model     *Model
	reloading bool    // a reload runs without mu; Get serves model meanwhile
	sig       fileSig // files the model was loaded from
	checked   time.Time
	fresh     atomic.Pointer[freshModel]
	err       error   // last failure (when model is nil, returned to callers)
	errSig    fileSig // files as they were at the failure
	failures  int
	nextRetry time.Time
}

// fileSig identifies the staged files' versions.
type fileSig struct {
	tokSize, cfgSize int64
	tokMod, cfgMod   time.Time
	cfgExists        bool
}

// PoolOption configures a Pool.
type PoolOption func(*Pool)

// WithCheckInterval sets how often a loaded model's files are stat'ed for
// changes (default 2s; 0 checks on every Get).
func WithCheckInterval(d time.Duration) PoolOption { return func(p *Pool) { p.check = d } }

// WithRetryBackoff bounds the wait before a failed load is retried: it starts
// at min and doubles per failure up to max (defaults 1s and 30s).
func WithRetryBackoff(min, max time.Duration) PoolOption {
	return func(p *Pool) { p.backoffMin, p.backoffMax = min, max }
}

// WithMaxModels bounds how many model names the pool tracks (default 256);
// failed entries are dropped first when it is full.
func WithMaxModels(n int) PoolOption { return func(p *Pool) { p.maxEntries = n } }

// WithTokenizerOptions passes options to every Load.
func WithTokenizerOptions(opts ...Option) PoolOption {
	return func(p *Pool) { p.tokOpts = append(p.tokOpts, opts...) }
}

// WithObserver sets the observer (metrics).
func WithObserver(o PoolObserver) PoolOption { return func(p *Pool) { p.observer = o } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) PoolOption { return func(p *Pool) { p.log = l } }

// withClock replaces time.Now (tests).
func withClock(now func() time.Time) PoolOption { return func(p *Pool) { p.now = now } }

// NewPool returns a pool over dir ("" means DefaultDir).
func NewPool(dir string, opts ...PoolOption) *Pool {
	if dir == "" {
		dir = DefaultDir
	}
	p := &Pool{
		dir: dir, check: 2 * time.Second, backoffMin: time.Second, backoffMax: 30 * time.Second,
		maxEntries: 256, log: slog.Default(), now: time.Now, entries: map[string]*poolEntry{},
	}
	for _, o := range opts {
		o(p)
	}
	if p.backoffMin <= 0 {
		p.backoffMin = time.Millisecond
	}
	p.backoffMax = max(p.backoffMax, p.backoffMin)
	p.maxEntries = max(p.maxEntries, 1)
	return p
}

// Dir returns the staging directory.
func (p *Pool) Dir() string { return p.dir }

// Path returns where the tokenizer.json of model is expected.
func (p *Pool) Path(model string) string {
	return filepath.Join(p.dir, Slug(model), "tokenizer.json")
}

func validSlug(slug string) bool {
	return slug != "" && len(slug) <= 255 && slug != "." && slug != ".." &&
		!strings.ContainsAny(slug, "\x00\\")
}

// Get returns the model's tokenizer, loading it on first use. Errors are
// typed: ErrNotFound (not staged), *UnsupportedError, *ParseError,
// ErrBadModelName.
func (p *Pool) Get(model string) (*Model, error) {
	slug := Slug(model)
	if !validSlug(slug) {
		return nil, fmt.Errorf("%w: %q", ErrBadModelName, shorten(model, 100))
	}
	e, err := p.entry(slug)
	if err != nil {
		return nil, err
	}
	now := p.now()
	if f := e.fresh.Load(); f != nil && now.Before(f.until) {
		return f.model, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.model != nil && (e.reloading || now.Sub(e.checked) < p.check) {
		return e.model, nil
	}
	defer func() {
		if e.model != nil && !e.reloading {
			e.fresh.Store(&freshModel{model: e.model, until: e.checked.Add(p.check)})
		}
	}()
	dir := filepath.Join(p.dir, slug)
	sig, statErr := statFiles(dir)
	if e.model != nil {
		e.checked = now
		if statErr != nil || sig == e.sig {
			// Unchanged, or removed: keep serving what was loaded.
			return e.model, nil
		}
		if e.err != nil && sig == e.errSig && now.Before(e.nextRetry) {
			return e.model, nil // this version failed already; wait for the retry
		}
		// Reload without holding the entry: others keep the old model meanwhile.
		e.reloading = true
		old := e.model
		e.mu.Unlock()
		m, d, err := p.loadModel(dir)
		e.mu.Lock()
		e.reloading = false
		p.finish(model, e, sig, m, err, d, true)
		if e.model == nil {
			e.model = old
		}
		return e.model, nil
	}
	if e.err != nil && now.Before(e.nextRetry) && (statErr != nil || sig == e.errSig) {
		return nil, e.err
	}
	if statErr != nil {
		p.fail(model, e, fileSig{}, statErr)
		return nil, e.err
	}
	m, d, err := p.loadModel(dir)
	p.finish(model, e, sig, m, err, d, false)
	if e.model == nil {
		return nil, e.err
	}
	return e.model, nil
}

func (p *Pool) entry(slug string) (*poolEntry, error) {
	p.mu.RLock()
	e, ok := p.entries[slug]
	p.mu.RUnlock()
	if ok {
		return e, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.entries[slug]; ok {
		return e, nil
	}
	if len(p.entries) >= p.maxEntries {
		for k, e := range p.entries {
			if e.mu.TryLock() {
				failed := e.model == nil
				e.mu.Unlock()
				if failed {
					delete(p.entries, k)
					break
				}
			}
		}
		if len(p.entries) >= p.maxEntries {
			return nil, fmt.Errorf("tokenizer: pool holds %d models, the limit", p.maxEntries)
		}
	}
	e = &poolEntry{}
	p.entries[slug] = e
	return e, nil
}

func (p *Pool) loadModel(dir string) (*Model, time.Duration, error) {
	start := time.Now()
	m, err := LoadModel(dir, p.tokOpts...)
	return m, time.Since(start), err
}

// finish records a load's outcome; e.mu is held.
func (p *Pool) finish(model string, e *poolEntry, sig fileSig, m *Model, err error, d time.Duration, reload bool) {
	if err != nil {
		p.fail(model, e, sig, err)
		if reload {
			p.log.Warn("tokenizer reload failed; serving the previous version", "model", model, "err", err)
		}
		return
	}
	e.model, e.sig, e.checked, e.err, e.failures = m, sig, p.now(), nil, 0
	if p.observer != nil {
		p.observer.TokenizerLoaded(model, reload, d)
	}
	p.log.Info("tokenizer loaded", "model", model, "reload", reload, "vocab", m.VocabSize(), "took", d)
}

func (p *Pool) fail(model string, e *poolEntry, sig fileSig, err error) {
	backoff := p.backoffMin << min(e.failures, 20)
	if backoff > p.backoffMax || backoff <= 0 {
		backoff = p.backoffMax
	}
	e.failures++
	e.err, e.errSig, e.nextRetry = err, sig, p.now().Add(backoff)
	if p.observer != nil {
		p.observer.TokenizerLoadFailed(model, err)
	}
	if e.failures == 1 {
		p.log.Warn("tokenizer load failed", "model", model, "reason", ErrorReason(err), "retry_in", backoff, "err", err)
	}
}

func statFiles(dir string) (fileSig, error) {
	var sig fileSig
	tokPath := filepath.Join(dir, "tokenizer.json")
	st, err := os.Stat(tokPath)
	if err != nil {
		if os.IsNotExist(err) {
			return sig, &notFoundError{path: tokPath, err: err}
		}
		return sig, fmt.Errorf("tokenizer: %w", err)
	}
	sig.tokSize, sig.tokMod = st.Size(), st.ModTime()
	if st, err := os.Stat(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		sig.cfgExists, sig.cfgSize, sig.cfgMod = true, st.Size(), st.ModTime()
	}
	return sig, nil
}

// PrefixStats sums the conversation prefix caches of the loaded models
// (docs/tokenizer.md, "Decision cost at long context").
func (p *Pool) PrefixStats() PrefixStats {
	p.mu.RLock()
	models := make([]*Model, 0, len(p.entries))
	for _, e := range p.entries {
		if f := e.fresh.Load(); f != nil && f.model != nil {
			models = append(models, f.model)
		}
	}
	p.mu.RUnlock()
	var sum PrefixStats
	for _, m := range models {
		s := m.PrefixStats()
		sum.Hits += s.Hits
		sum.Misses += s.Misses
		sum.ReusedBytes += s.ReusedBytes
		sum.Bytes += s.Bytes
		sum.Entries += s.Entries
	}
	return sum
}
