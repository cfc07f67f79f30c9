package inventory

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
)

// Limits and defaults of the provisional overlay (docs/selection.md,
// "Provisional blocks").
const (
	// DefaultProvisionalMaxPerEndpoint bounds the predicted blocks held per
	// endpoint: 65,536 blocks is about 1 M tokens of prompts in flight at
	// block size 16, far beyond one engine's waiting queue.
	DefaultProvisionalMaxPerEndpoint = 65536
	MaxProvisionalMaxPerEndpoint     = 1 << 22
	// DefaultProvisionalTTL is how long a predicted block stays without its
	// BlockStored: a few times a long prefill under load.
	DefaultProvisionalTTL = 10 * time.Second
	MaxProvisionalTTL     = 10 * time.Minute
	// DefaultProvisionalWeight is the credit, in percent of a stored block,
	// of a predicted one: a little under a stored block, so a block an
	// engine reported wins a tie against one still being computed.
	DefaultProvisionalWeight = 90
)

// ProvisionalOptions configure an Overlay. Zero values take the defaults.
type ProvisionalOptions struct {
	// MaxPerEndpoint bounds the predicted blocks per endpoint; when full,
	// the oldest predictions go first.
	MaxPerEndpoint int
	// TTL drops a prediction whose BlockStored never came.
	TTL time.Duration
	// Weight is the credit of a predicted block in percent of a stored one
	// (1..100). Negative disables the overlay's credit (predictions are
	// still kept and counted).
	Weight int
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

func (o *ProvisionalOptions) fill() error {
	if o.MaxPerEndpoint == 0 {
		o.MaxPerEndpoint = DefaultProvisionalMaxPerEndpoint
	}
	if o.TTL == 0 {
		o.TTL = DefaultProvisionalTTL
	}
	if o.Weight == 0 {
		o.Weight = DefaultProvisionalWeight
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	switch {
	case o.MaxPerEndpoint < 1 || o.MaxPerEndpoint > MaxProvisionalMaxPerEndpoint:
		return fmt.Errorf("inventory: provisional cap %d outside [1, %d]", o.MaxPerEndpoint, MaxProvisionalMaxPerEndpoint)
	case o.TTL < 0 || o.TTL > MaxProvisionalTTL:
		return fmt.Errorf("inventory: provisional TTL %v outside (0, %v]", o.TTL, MaxProvisionalTTL)
	case o.Weight > 100:
		return fmt.Errorf("inventory: provisional weight %d%% above 100%%", o.Weight)
	}
	if o.Weight < 0 {
		o.Weight = 0
	}
	return nil
}

// Overlay puts provisional blocks over an Index: the blocks kvgate predicts
// an endpoint will hold because it has just routed a prompt there, before
// the engine's KV events report them. The event-fed Index stays exactly the
// engines' state; the overlay only adds credit when scoring, and forgets a
// prediction when its BlockStored arrives (Add), when the request that made
// it ends (Release), when its endpoint is cleared, or after the TTL.
//
// The SGLang router and NVIDIA Dynamo's KV router do the same at decision
// time (docs/selection.md, "Provisional blocks", cites their code).
//
// Overlay implements the selector's scorer and the subscribers' sink: put it
// where the Index was. All methods are safe for concurrent use.
type Overlay struct {
	base *Index
	opts ProvisionalOptions

	mu  sync.RWMutex
	eps [epset.Max]*provEndpoint
	// live is the number of predictions held, read without the lock so
	// scoring skips the overlay entirely when nothing is in flight.
	live atomic.Int64
}

// provEndpoint is one endpoint's predictions: refs counts the requests in
// flight that predicted a block, and order is the insertion order the cap
// and the TTL evict in (an entry refreshed later is found again further
// back; the stale copy is skipped by its stamp).
type provEndpoint struct {
	entries map[uint64]provEntry
	order   []provStamp
	head    int // order[head:] is live
}

type provEntry struct {
	refs    int32
	expires int64 // unix nanoseconds
}

type provStamp struct {
	hash    uint64
	expires int64
}

// NewOverlay returns an empty overlay over base.
func NewOverlay(base *Index, opts ProvisionalOptions) (*Overlay, error) {
	if base == nil {
		return nil, errors.New("inventory: overlay needs an index")
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	return &Overlay{base: base, opts: opts}, nil
}

// Index is the event-fed index under the overlay.
func (o *Overlay) Index() *Index { return o.base }

// Reservation is one routed request's predicted blocks on one endpoint.
// Its zero value releases nothing.
type Reservation struct {
	ep     int
	hashes []uint64
}

// Reserve records that endpoint ep will hold hashes (a prompt's block
// hashes, in order) once the request just routed there is prefilled. The
// caller keeps hashes unchanged until Release. At most MaxPerEndpoint
// predictions are kept per endpoint: the oldest go first, and a prompt
// longer than the cap predicts only its first MaxPerEndpoint blocks.
func (o *Overlay) Reserve(ep int, hashes []uint64) Reservation {
	if ep < 0 || ep >= epset.Max || len(hashes) == 0 {
		return Reservation{ep: -1}
	}
	if len(hashes) > o.opts.MaxPerEndpoint {
		hashes = hashes[:o.opts.MaxPerEndpoint]
	}
	now := o.opts.Now().UnixNano()
	exp := now + int64(o.opts.TTL)
	o.mu.Lock()
	pe := o.eps[ep]
	if pe == nil {
		pe = &provEndpoint{entries: make(map[uint64]provEntry, len(hashes))}
		o.eps[ep] = pe
	}
	removed := pe.expire(now)
	added := 0
	for _, h := range hashes {
		e, ok := pe.entries[h]
		if !ok {
			removed += pe.makeRoom(o.opts.MaxPerEndpoint)
			added++
		}
		e.refs++
		e.expires = exp
		pe.entries[h] = e
		pe.order = append(pe.order, provStamp{hash: h, expires: exp})
	}
	pe.compact()
	o.mu.Unlock()
	o.live.Add(int64(added - removed))
	return Reservation{ep: ep, hashes: hashes}
}

// Release ends a reservation: the request failed or ended. Predictions
// whose BlockStored never arrived, and that no other request in flight
// shares, are dropped. Releasing twice is harmless only for the zero
// Reservation; callers release once.
func (o *Overlay) Release(r Reservation) {
	if r.ep < 0 || len(r.hashes) == 0 {
		return
	}
	removed := 0
	o.mu.Lock()
	if pe := o.eps[r.ep]; pe != nil {
		for _, h := range r.hashes {
			e, ok := pe.entries[h]
			if !ok {
				continue // confirmed, expired or evicted already
			}
			if e.refs--; e.refs > 0 {
				pe.entries[h] = e
				continue
			}
			delete(pe.entries, h)
			removed++
		}
		pe.compact()
	}
	o.mu.Unlock()
	o.live.Add(int64(-removed))
}

// expire drops the predictions past their TTL from the front of order.
func (pe *provEndpoint) expire(now int64) (removed int) {
	for pe.head < len(pe.order) {
		st := pe.order[pe.head]
		e, ok := pe.entries[st.hash]
		if ok && e.expires == st.expires && st.expires > now {
			break // the oldest live prediction is still fresh
		}
		if ok && e.expires == st.expires {
			delete(pe.entries, st.hash)
			removed++
		}
		pe.head++
	}
	return removed
}

// makeRoom evicts the oldest live prediction while the endpoint is at its
// cap.
func (pe *provEndpoint) makeRoom(limit int) (removed int) {
	for len(pe.entries) >= limit && pe.head < len(pe.order) {
		st := pe.order[pe.head]
		pe.head++
		if e, ok := pe.entries[st.hash]; ok && e.expires == st.expires {
			delete(pe.entries, st.hash)
			removed++
		}
	}
	return removed
}

// compact bounds order: stamps of entries that were confirmed, released or
// refreshed are dropped once they outnumber the live ones, so order stays
// within about twice the cap plus one prompt.
func (pe *provEndpoint) compact() {
	if len(pe.entries) == 0 {
		pe.order, pe.head = pe.order[:0], 0
		return
	}
	if pe.head < len(pe.order)/2 && len(pe.order)-pe.head <= 2*len(pe.entries)+64 {
		return
	}
	kept := pe.order[:0]
	for _, st := range pe.order[pe.head:] {
		if e, ok := pe.entries[st.hash]; ok && e.expires == st.expires {
			kept = append(kept, st)
		}
	}
	clear(pe.order[len(kept):])
	pe.order, pe.head = kept, 0
}

// Provisional is the number of predictions held for ep (live or past
// their TTL but not yet swept).
func (o *Overlay) Provisional(ep int) int {
	if ep < 0 || ep >= epset.Max {
		return 0
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	if pe := o.eps[ep]; pe != nil {
		return len(pe.entries)
	}
	return 0
}

// Score is Index.Score plus the credit of provisional blocks: with
// leadingRun, an endpoint's leading run of stored blocks is extended by the
// consecutive blocks predicted for it, each worth Weight percent of a
// stored block (rounded down). Without leadingRun (the literal overlap
// count) an endpoint scores the larger of its stored overlap and its
// weighted predicted overlap.
func (o *Overlay) Score(hashes []uint64, eligible epset.Set, leadingRun bool, counts *[epset.Max]uint32) {
	if len(hashes) == 0 || o.live.Load() == 0 || o.opts.Weight == 0 {
		o.base.Score(hashes, eligible, leadingRun, counts)
		return
	}
	if leadingRun {
		o.scoreRunWithPredictions(hashes, eligible, counts)
		return
	}
	o.base.Score(hashes, eligible, false, counts)
	now := o.opts.Now().UnixNano()
	w := uint64(o.opts.Weight)
	o.mu.RLock()
	defer o.mu.RUnlock()
	for ep := eligible.Next(0); ep >= 0; ep = eligible.Next(ep + 1) {
		pe := o.eps[ep]
		if pe == nil || len(pe.entries) == 0 {
			continue
		}
		stored := counts[ep]
		n := 0
		for _, h := range hashes {
			if pe.holds(h, now) {
				n++
			}
		}
		counts[ep] = max(stored, uint32(uint64(n)*w/100))
	}
}

// scoreRunWithPredictions is Score's leading run: each endpoint's run of
// stored blocks (on any scored tier, docs/selection.md "Offload tiers in the
// score") is extended from where it really ends by the consecutive blocks
// predicted for it. The stored part is the index's weighted count.
func (o *Overlay) scoreRunWithPredictions(hashes []uint64, eligible epset.Set, counts *[epset.Max]uint32) {
	var runs [epset.Max]uint32
	o.base.scoreLeadingRuns(hashes, eligible, counts, &runs)
	now := o.opts.Now().UnixNano()
	w := uint64(o.opts.Weight)
	o.mu.RLock()
	defer o.mu.RUnlock()
	for ep := eligible.Next(0); ep >= 0; ep = eligible.Next(ep + 1) {
		pe := o.eps[ep]
		if pe == nil || len(pe.entries) == 0 {
			continue
		}
		start := int(runs[ep])
		run := start
		for run < len(hashes) && pe.holds(hashes[run], now) {
			run++
		}
		counts[ep] += uint32(uint64(run-start) * w / 100)
	}
}

func (pe *provEndpoint) holds(h uint64, now int64) bool {
	e, ok := pe.entries[h]
	return ok && e.expires > now
}

// Blocks is the endpoint's stored (event-reported) inventory size;
// predictions do not count, so cold-start seeding and the blocks gauge see
// only what the engine reported.
func (o *Overlay) Blocks(ep int) int { return o.base.Blocks(ep) }

// ExpectStored passes a burst's reservation to the index (reserve.go).
func (o *Overlay) ExpectStored(ep, n int) { o.base.ExpectStored(ep, n) }

// Add records stored blocks in the index and confirms the predictions
// they match: a BlockStored replaces the guess.
func (o *Overlay) Add(ep, rank int, medium string, hashes []uint64) error {
	if err := o.base.Add(ep, rank, medium, hashes); err != nil {
		return err
	}
	if IsGPU(medium) {
		o.confirm(ep, hashes)
	}
	return nil
}

func (o *Overlay) confirm(ep int, hashes []uint64) {
	if o.live.Load() == 0 || ep < 0 || ep >= epset.Max {
		return
	}
	removed := 0
	o.mu.Lock()
	if pe := o.eps[ep]; pe != nil && len(pe.entries) > 0 {
		for _, h := range hashes {
			if _, ok := pe.entries[h]; ok {
				delete(pe.entries, h)
				removed++
			}
		}
		pe.compact()
	}
	o.mu.Unlock()
	o.live.Add(int64(-removed))
}

// Remove forwards to the index.
func (o *Overlay) Remove(ep, rank int, medium string, hashes []uint64) error {
	return o.base.Remove(ep, rank, medium, hashes)
}

// ClearRank clears the rank in the index and drops the endpoint's
// predictions: an engine that reset its cache holds none of them.
func (o *Overlay) ClearRank(ep, rank int) error {
	if err := o.base.ClearRank(ep, rank); err != nil {
		return err
	}
	o.dropEndpoint(ep)
	return nil
}

// ClearEndpoint clears the endpoint in the index and drops its predictions.
func (o *Overlay) ClearEndpoint(ep int) error {
	if err := o.base.ClearEndpoint(ep); err != nil {
		return err
	}
	o.dropEndpoint(ep)
	return nil
}

func (o *Overlay) dropEndpoint(ep int) {
	if ep < 0 || ep >= epset.Max {
		return
	}
	o.mu.Lock()
	pe := o.eps[ep]
	o.eps[ep] = nil
	o.mu.Unlock()
	if pe != nil {
		o.live.Add(int64(-len(pe.entries)))
	}
}
