package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// warnInterval is how often one kind of tokenizer warning may be logged: a
// client that sends a new unknown model per request would otherwise write
// two WARN lines per request (docs/limits.md).
const warnInterval = 10 * time.Second

// maxWarnKeys bounds the limiter's memory; the keys are the code's own
// messages and error reasons, so the bound is never reached in practice.
const maxWarnKeys = 256

// rateLimitedHandler passes at most one record per interval for each
// (message, reason attribute) pair at WARN and above; it counts what it
// drops and adds the count as "suppressed" to the next record it passes.
// Lower levels pass untouched.
type rateLimitedHandler struct {
	slog.Handler
	st *warnState
}

type warnState struct {
	mu       sync.Mutex
	interval time.Duration
	now      func() time.Time
	last     map[string]time.Time
	dropped  map[string]int
}

func newRateLimitedHandler(h slog.Handler, interval time.Duration) *rateLimitedHandler {
	return &rateLimitedHandler{Handler: h, st: &warnState{interval: interval, now: time.Now,
		last: map[string]time.Time{}, dropped: map[string]int{}}}
}

func (h *rateLimitedHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.Handler.Handle(ctx, r)
	}
	key := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			key += "\x00" + a.Value.String()
			return false
		}
		return true
	})
	st := h.st
	st.mu.Lock()
	now := st.now()
	if last, ok := st.last[key]; ok && now.Sub(last) < st.interval {
		st.dropped[key]++
		st.mu.Unlock()
		return nil
	}
	if len(st.last) >= maxWarnKeys {
		clear(st.last)
		clear(st.dropped)
	}
	st.last[key] = now
	n := st.dropped[key]
	delete(st.dropped, key)
	st.mu.Unlock()
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", n), slog.Duration("suppressed_over", st.interval))
	}
	return h.Handler.Handle(ctx, r)
}

func (h *rateLimitedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &rateLimitedHandler{Handler: h.Handler.WithAttrs(as), st: h.st}
}

func (h *rateLimitedHandler) WithGroup(name string) slog.Handler {
	return &rateLimitedHandler{Handler: h.Handler.WithGroup(name), st: h.st}
}
