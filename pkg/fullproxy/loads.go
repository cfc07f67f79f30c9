package fullproxy

import (
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/epset"
)

func (s *Server) incLoad(ep int) { s.obs.Inflight(s.cfg.Service, ep, s.loads.Inc(ep)) }
func (s *Server) decLoad(ep int) { s.obs.Inflight(s.cfg.Service, ep, s.loads.Dec(ep)) }

// Loads counts in-flight requests per endpoint (ep_idx). The zero value is
// ready; it is safe for concurrent use.
type Loads struct {
	n [epset.Max]atomic.Int64
}

// Inc adds one in-flight request to ep and returns the new count.
func (l *Loads) Inc(ep int) int {
	if uint(ep) < epset.Max {
		return int(l.n[ep].Add(1))
	}
	return 0
}

// Dec removes one in-flight request from ep and returns the new count.
func (l *Loads) Dec(ep int) int {
	if uint(ep) < epset.Max {
		return int(l.n[ep].Add(-1))
	}
	return 0
}

// InFlight is Load under the name selector.LoadSource uses.
func (l *Loads) InFlight(ep int) int { return l.Load(ep) }

// Load is ep's in-flight count.
func (l *Loads) Load(ep int) int {
	if uint(ep) < epset.Max {
		return int(l.n[ep].Load())
	}
	return 0
}

// Total is the sum over all endpoints.
func (l *Loads) Total() int {
	t := int64(0)
	for i := range l.n {
		t += l.n[i].Load()
	}
	return int(t)
}
