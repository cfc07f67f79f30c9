package selector

import "github.com/kvgate/kvgate/pkg/epset"

// Advice is the AI controller's advice for one rule (docs/controller.md).
// It only narrows or reweights what local health allows: an endpoint that
// is down stays down whatever the advice says.
type Advice struct {
	// Weight is an endpoint's weight in percent (0..100) multiplying its
	// capacity in the tier-1.5 blend; 0 floors the capacity to 1. An
	// endpoint missing here keeps its static CapacityWeight.
	Weight map[int]int
	// Draining endpoints keep their tier-1 sessions but take no new
	// assignment, unless every candidate of the role is draining.
	Draining epset.Set
	// Disabled endpoints are excluded entirely.
	Disabled epset.Set
}

// SetAdvice applies a (nil drops it, back to static weights). The rule and
// the advice are swapped in as one compiled value, so a decision sees all
// of a snapshot or none of it.
func (s *Selector) SetAdvice(a *Advice) {
	s.adviceMu.Lock()
	defer s.adviceMu.Unlock()
	s.advice = a
	c := *s.rule.Load()
	c.advise(a)
	s.rule.Store(&c)
}

// advise recomputes the capacity weights from the rule and a.
func (c *compiled) advise(a *Advice) {
	c.draining, c.disabled = epset.Set{}, epset.Set{}
	for _, e := range c.rule.Endpoints {
		w := int64(e.CapacityWeight)
		if w <= 0 || w > 100 {
			w = 100
		}
		if a != nil {
			if aw, ok := a.Weight[e.Idx]; ok {
				w = int64(max(0, min(aw, 100)))
			}
		}
		c.capWeight[e.Idx] = w
	}
	if a != nil {
		c.draining = a.Draining.And(c.all)
		c.disabled = a.Disabled.And(c.all)
	}
}

// undrained is set without the draining endpoints, or set itself when that
// would leave nothing: draining is advice, not an outage.
func undrained(set, draining epset.Set) epset.Set {
	if rest := set.AndNot(draining); !rest.Empty() {
		return rest
	}
	return set
}
