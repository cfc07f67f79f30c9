package gateway

import (
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

// timedScorer decorates a rule's inventory scorer (selector.Scorer) to time
// the "score" decision stage. The selector scores inside Attempt.Decide, so
// the router cannot time that stage itself; the decorator credits each Score
// call to the request whose hashes it scores, and the router reports the sum
// as "score" and the rest of Decide as "select" (so neither counts the other).
//
// Requests are told apart by their hash slice: Score receives the request's
// own Hashes (selector.Request.Hashes, whose backing array belongs to one
// request's plan), so its first element's address is a per-request key.
type timedScorer struct {
	selector.Scorer

	mu      sync.Mutex
	pending map[*uint64]*scoreTime
}

// scoreTime accumulates the scoring time of one Decide call.
type scoreTime struct {
	d     time.Duration
	calls int
}

func newTimedScorer(s selector.Scorer) *timedScorer {
	return &timedScorer{Scorer: s, pending: make(map[*uint64]*scoreTime)}
}

// Score implements selector.Scorer, timing the wrapped call.
func (t *timedScorer) Score(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32) {
	start := time.Now()
	t.Scorer.Score(hashes, eligible, leadingRun, counts)
	d := time.Since(start)
	if len(hashes) == 0 {
		return
	}
	t.mu.Lock()
	if acc := t.pending[&hashes[0]]; acc != nil {
		acc.d += d
		acc.calls++
	}
	t.mu.Unlock()
}

// track credits Score calls on hashes to acc until the returned function is
// called. Requests without hashes are never scored; track is then a no-op.
func (t *timedScorer) track(hashes []uint64, acc *scoreTime) (untrack func()) {
	if t == nil || len(hashes) == 0 {
		return func() {}
	}
	key := &hashes[0]
	t.mu.Lock()
	t.pending[key] = acc
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.pending, key)
		t.mu.Unlock()
	}
}
