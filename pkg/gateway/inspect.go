package gateway

import (
	"errors"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/chattemplate"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// Request-side bounds (docs/tokenizer.md, "Bounds"): what inspecting one
// request may cost before kvgate gives up on routing it by KV and forwards it
// unchanged under guard reason tokenize.
const (
	// tokenizeBudget bounds one request's render and tokenize time. A
	// 262144-token prompt encodes cold in about 50 ms here; the budget only
	// stops hostile inputs.
	tokenizeBudget = 2 * time.Second
	// inspectBudgetBytes bounds the request bodies being tokenized at once,
	// process-wide; tokenizing costs a few times the body in memory.
	inspectBudgetBytes = 32 << 20
	// inspectFreeBytes: bodies this small skip the byte budget (they cannot
	// exhaust memory, and must never be refused for a large one's sake).
	inspectFreeBytes = 256 << 10
	// releaseAfterBytes: after inspecting a body this large, return freed
	// heap to the OS (at most once per releaseEvery), so a burst of huge
	// prompts does not leave the process at its peak RSS.
	releaseAfterBytes = 4 << 20
	releaseEvery      = 10 * time.Second
)

// Causes of kvgate_kv_skip_total{cause}: the detail behind a tokenize (or,
// for an over-large body, text_empty) guard miss.
const (
	causeTokens       = tokenizer.CauseTokens // more than LLB_KV_MAX_PROMPT_TOKENS
	causeWord         = tokenizer.CauseWord   // a pre-token above tokenizer.DefaultMaxWordBytes
	causeTime         = tokenizer.CauseTime   // tokenizeBudget spent
	causeBusy         = "inspect_busy"        // inspectBudgetBytes in use by other requests
	causeUntrusted    = "request_chat_template"
	causeTemplateCost = "template_limit" // the chat template hit a render bound
	causeTokenizer    = "tokenizer"      // no usable tokenizer staged for the model
	causeError        = "error"          // any other render or encode failure
	causePath         = "path"           // a body sent to a path that is not a prompt-bearing API (text_empty)
)

// skipCause classifies a tokenize failure for kvgate_kv_skip_total.
func skipCause(err error) string {
	if c := tokenizer.LimitCause(err); c != "" {
		return c
	}
	switch {
	case errors.Is(err, chattemplate.ErrLimit):
		return causeTemplateCost
	case errors.Is(err, tokenizer.ErrNotFound), errors.Is(err, tokenizer.ErrBadModelName):
		return causeTokenizer
	}
	var unsup *tokenizer.UnsupportedError
	var perr *tokenizer.ParseError
	if errors.As(err, &unsup) || errors.As(err, &perr) {
		return causeTokenizer
	}
	return causeError
}

// inspectGate bounds the body bytes being tokenized at once. acquire never
// waits: a request that does not fit is forwarded without KV routing rather
// than queued behind the expensive ones.
type inspectGate struct {
	capacity, free int64
	used           atomic.Int64

	guard       *recovery.Guard
	pending     atomic.Bool  // a release is scheduled or running
	lastRelease atomic.Int64 // unix ns of the last release
}

func newInspectGate(capacity, free int64, guard *recovery.Guard) *inspectGate {
	return &inspectGate{capacity: capacity, free: free, guard: guard}
}

// acquire reserves n bytes; release must be called once when ok.
func (g *inspectGate) acquire(n int) (release func(), ok bool) {
	size := int64(n)
	if g == nil || size <= g.free {
		return func() {}, true
	}
	if g.used.Add(size) > g.capacity {
		g.used.Add(-size)
		return nil, false
	}
	return func() {
		g.used.Add(-size)
		if size >= releaseAfterBytes {
			g.maybeRelease()
		}
	}, true
}

// maybeRelease returns freed memory to the OS in the background, at most
// once per releaseEvery (a release forces a GC): the Go runtime otherwise
// hands back a large transient heap only gradually. A release asked for
// within the interval runs at its end, so the last of a burst is released
// too.
func (g *inspectGate) maybeRelease() {
	if !g.pending.CompareAndSwap(false, true) {
		return // one is scheduled already; it will see this request's garbage
	}
	wait := time.Duration(g.lastRelease.Load() + int64(releaseEvery) - time.Now().UnixNano())
	g.guard.Go(recovery.Poller, func() {
		defer g.pending.Store(false)
		if wait > 0 {
			time.Sleep(wait)
		}
		g.lastRelease.Store(time.Now().UnixNano())
		debug.FreeOSMemory()
	})
}
