package tokenizer

import (
	"errors"
	"fmt"
	"time"
)

// Limits bound the work of one encode, so a hostile prompt costs a bounded
// time and memory and then fails with a *LimitError instead of holding a core
// and hundreds of megabytes (docs/tokenizer.md, "Bounds"). The zero value
// bounds nothing, which is what Encode uses.
type Limits struct {
	// MaxTokens stops the encode once more ids than this were produced
	// (LLB_KV_MAX_PROMPT_TOKENS in the daemon). 0: unbounded.
	MaxTokens int
	// MaxWordBytes refuses a pre-token (one BPE word) longer than this
	// before merging it: BPE over one word costs O(n log n) with a large
	// constant, about 1 µs per byte (a 15 MiB run of one letter took 19 s),
	// and no real prompt holds a word of more than a few KiB. 0: unbounded.
	MaxWordBytes int
	// Deadline stops the encode between words once passed. Zero: none.
	Deadline time.Time
}

// DefaultMaxWordBytes is the daemon's MaxWordBytes: 64 KiB takes 30–100 ms
// to merge on the committed tokenizers, and is longer than any pre-token of
// the corpora.
const DefaultMaxWordBytes = 64 << 10

// Limit causes, as LimitError.Cause reports them (and the daemon's
// kvgate_kv_skip_total{cause} counts them).
const (
	CauseTokens = "prompt_tokens" // more ids than Limits.MaxTokens
	CauseWord   = "word_bytes"    // a pre-token longer than Limits.MaxWordBytes
	CauseTime   = "tokenize_time" // Limits.Deadline passed
)

// ErrLimit is matched (errors.Is) by every *LimitError.
var ErrLimit = errors.New("tokenizer: encode limit exceeded")

// LimitError reports which bound an encode hit.
type LimitError struct {
	Cause  string // CauseTokens, CauseWord or CauseTime
	Detail string
}

func (e *LimitError) Error() string { return fmt.Sprintf("tokenizer: %s limit: %s", e.Cause, e.Detail) }

// Is makes errors.Is(err, ErrLimit) hold.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// LimitCause returns the cause of a *LimitError in err's chain, or "".
func LimitCause(err error) string {
	var le *LimitError
	if errors.As(err, &le) {
		return le.Cause
	}
	return ""
}

// budget is one encode's running account against its Limits; nil when the
// encode is unbounded. Checks are cheap (an int compare per word, a clock
// read every clockEvery words or chunk).
type budget struct {
	lim   Limits
	base  int // len(ids) when the encode started
	words int
	err   error
}

const clockEvery = 256

func newBudget(lim Limits, base int) *budget {
	if lim == (Limits{}) {
		return nil
	}
	return &budget{lim: lim, base: base}
}

// word checks one pre-token before it is merged.
func (b *budget) word(w string) bool {
	if b == nil {
		return true
	}
	if b.err != nil {
		return false
	}
	if b.lim.MaxWordBytes > 0 && len(w) > b.lim.MaxWordBytes {
		b.err = &LimitError{Cause: CauseWord, Detail: fmt.Sprintf("a %d-byte word, limit %d", len(w), b.lim.MaxWordBytes)}
		return false
	}
	b.words++
	if b.words%clockEvery == 0 {
		return b.clock()
	}
	return true
}

// ids checks the ids produced so far.
func (b *budget) ids(n int) bool {
	if b == nil {
		return true
	}
	if b.err != nil {
		return false
	}
	if b.lim.MaxTokens > 0 && n-b.base > b.lim.MaxTokens {
		b.err = &LimitError{Cause: CauseTokens, Detail: fmt.Sprintf("more than %d tokens", b.lim.MaxTokens)}
		return false
	}
	return true
}

func (b *budget) clock() bool {
	if b == nil {
		return true
	}
	if b.err != nil {
		return false
	}
	if !b.lim.Deadline.IsZero() && time.Now().After(b.lim.Deadline) {
		b.err = &LimitError{Cause: CauseTime, Detail: "time budget spent"}
		return false
	}
	return true
}

func (b *budget) failed() error {
	if b == nil {
		return nil
	}
	return b.err
}
