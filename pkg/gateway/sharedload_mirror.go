package gateway

// The mirror (docs/replicas.md, "Shared load view"): between two scrapes the
// other replicas' part of the view is frozen, yet they keep sending. Replicas
// that see the same view and run the same selector make the same choices, so
// the least-loaded endpoint at a scrape draws every replica's requests until
// the next one. The mirror assumes the others change their load on each
// endpoint as this replica changed its own since that endpoint's scrape,
// scaled by how much of the fleet's load they carry:
//
//	others_i ← max(0, others_i + round(F · (onEngine_i − onEngine_i@scrape)))
//	F        = Σ others_j / max(1, Σ onEngine_j@scrape), over fresh samples, ≤ maxMirrorRatio
//
// With one replica the engines count only its requests, others_j is 0 and F
// is 0: the view is unchanged.

import (
	"math"
	"sync/atomic"
	"time"
)

const (
	// maxMirrorRatio bounds F: a replica that carried nothing at the scrape
	// would otherwise scale its first request by the whole fleet's load.
	maxMirrorRatio = 8
	// mirrorRefresh is how long F is reused before it is computed again (one
	// pass over the scraped endpoints), so a decision's loads cost O(n).
	mirrorRefresh = 100 * time.Millisecond
)

// mirrorRatio caches F in thousandths and when it was computed.
type mirrorRatio struct {
	milli atomic.Int64
	at    atomic.Int64 // UnixNano; 0 before the first computation
}

// mirrored is others_i extrapolated by this replica's own change since the
// scrape, delta.
func (s *sharedLoads) mirrored(others, delta int) int {
	if delta == 0 {
		return others
	}
	f := s.mirrorRatio()
	if f == 0 {
		return others
	}
	return max(0, others+int(math.Round(float64(delta)*float64(f)/1000)))
}

// mirrorRatio is F in thousandths, computed at most every mirrorRefresh.
func (s *sharedLoads) mirrorRatio() int64 {
	now := s.now()
	if at := s.ratio.at.Load(); at != 0 && now.Sub(time.Unix(0, at)) < mirrorRefresh {
		return s.ratio.milli.Load()
	}
	stale := time.Duration(s.staleAfter.Load())
	var others, mine int64
	for ep := range int(s.maxEp.Load()) {
		load, at, ok := s.engine.EngineLoad(ep)
		if !ok || now.Sub(at) > stale {
			continue
		}
		a := s.atScrape[ep].Load()
		others += max(0, int64(load)-a)
		mine += a
	}
	f := min(others*1000/max(1, mine), maxMirrorRatio*1000)
	s.ratio.milli.Store(f)
	s.ratio.at.Store(now.UnixNano())
	return f
}
