package gateway

// The shared load view (docs/replicas.md, "Shared load view"): with several
// kvgate replicas in front of one fleet, each sees only its own in-flight
// requests, so the bounded-load cap would let every replica load the same
// endpoint to its cap. The engines' own count (running + waiting, scraped
// from /metrics) includes every replica's requests; between two scrapes the
// replica adds the change in its own in-flight count since the scrape.

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

// engineLoads gives an endpoint's scraped engine load and when it was taken
// (health.Tracker.EngineLoad, through the rule's current tracker).
type engineLoads interface {
	EngineLoad(ep int) (load int, at time.Time, known bool)
}

// sharedLoads is the selector's L_i:
//
//	L_i = max(local_i, max(0, engine_i − onEngine_i@scrape) + local_i)
//
// local_i is this replica's in-flight count now, engine_i the engine's
// running + waiting at its last scrape and onEngine_i@scrape the part of
// this replica's count the engine was running at that instant; so the
// other replicas' load is frozen at the scrape and this replica's own is
// live. For a single-pool rule onEngine is local itself (the proxy's
// count). For a P/D rule local is the admission controller's count, which
// holds a prefill endpoint's request until its decode ends, and onEngine
// the requests still in the leg that endpoint's engine runs
// (admission.Controller.Legs). A sample older than staleAfter (or none)
// leaves local_i alone.
type sharedLoads struct {
	local selector.LoadSource
	// onEngine is the count snapshotted at each scrape: what of this
	// replica's load the engine's running + waiting includes.
	onEngine selector.LoadSource
	// onEngineIsLocal: onEngine is local (single-pool rules).
	onEngineIsLocal bool
	engine          engineLoads
	now             func() time.Time
	// staleAfter is in nanoseconds, updated with the rule's probe interval.
	staleAfter atomic.Int64
	// halfLife, when positive, decays the other replicas' part between
	// scrapes: others · 2^(−age/halfLife), on the guess that the requests
	// seen at the scrape end and nothing replaces them. Off (0) by default:
	// the routing benchmark measured it (docs/replicas.md, "Shared load view").
	halfLife time.Duration
	// mirror extrapolates the other replicas' part between scrapes from
	// this replica's own change since the scrape (sharedload_mirror.go); off by default.
	mirror   bool
	atScrape [epset.Max]atomic.Int64
	// maxEp is one more than the highest endpoint ever scraped, bounding the
	// mirror's pass over the endpoints.
	maxEp atomic.Int64
	ratio mirrorRatio
}

// sharedOptions are the view's variants (gateway.Options).
type sharedOptions struct {
	halfLife time.Duration
	mirror   bool
}

// newSharedLoads builds the view; onEngine nil means local (single-pool
// rules, whose every in-flight request is on its engine).
func newSharedLoads(local, onEngine selector.LoadSource, engine engineLoads, staleAfter time.Duration) *sharedLoads {
	isLocal := onEngine == nil
	if isLocal {
		onEngine = local
	}
	s := &sharedLoads{local: local, onEngine: onEngine, onEngineIsLocal: isLocal, engine: engine, now: time.Now}
	s.staleAfter.Store(int64(staleAfter))
	return s
}

// configure applies the view's variants; called before the selector reads it.
func (s *sharedLoads) configure(o sharedOptions) {
	s.halfLife, s.mirror = o.halfLife, o.mirror
}

// scraped takes the snapshot of onEngine_i@scrape; the tracker calls it
// just before it stores ep's new engine load.
func (s *sharedLoads) scraped(ep int) {
	if uint(ep) < epset.Max {
		s.atScrape[ep].Store(int64(s.onEngine.InFlight(ep)))
		for {
			m := s.maxEp.Load()
			if int64(ep) < m || s.maxEp.CompareAndSwap(m, int64(ep)+1) {
				break
			}
		}
	}
}

// InFlight implements selector.LoadSource.
func (s *sharedLoads) InFlight(ep int) int {
	local := s.local.InFlight(ep)
	if uint(ep) >= epset.Max {
		return local
	}
	load, at, ok := s.engine.EngineLoad(ep)
	if !ok || s.now().Sub(at) > time.Duration(s.staleAfter.Load()) {
		return local
	}
	atScrape := int(s.atScrape[ep].Load())
	others := max(0, load-atScrape)
	if age := s.now().Sub(at); s.halfLife > 0 && age > 0 && others > 0 {
		others = int(math.Round(float64(others) * math.Exp2(-float64(age)/float64(s.halfLife))))
	}
	if s.mirror {
		onEngine := local
		if !s.onEngineIsLocal {
			onEngine = s.onEngine.InFlight(ep)
		}
		others = s.mirrored(others, onEngine-atScrape)
	}
	return max(local, others+local)
}

// sharedStaleAfter is how old a scrape may be before the view falls back to
// the replica's own count: two probe intervals plus a probe timeout, so one
// slow or failed scrape does not drop the other replicas' load.
func sharedStaleAfter(interval, timeout time.Duration) time.Duration {
	return 2*interval + timeout
}
