package health

import "time"

// BreakerState is a circuit breaker's state.
type BreakerState uint8

const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return "closed"
}

// BreakerConfig parameterises a breaker.
type BreakerConfig struct {
	// Off: the rule has no breaker (a plain rule without cb_enable; P/D
	// rules always have one, docs/api.md). Outcomes are not counted, so it
	// never opens and Allow admits every request.
	Off bool
	// FailureThreshold consecutive connect failures open it (default 5; P/D rules 3).
	FailureThreshold int
	// OriginErrThreshold consecutive origin 5xx answers open it
	// (LLB_PD_ORIGIN_ERR_THRESHOLD, default 3; 0 disables).
	OriginErrThreshold int
	// OpenFor is how long it stays open before half-open (default 30 s).
	OpenFor time.Duration
	// HalfOpenTrials is the most requests admitted while half-open (default 3).
	HalfOpenTrials int
}

// Breaker defaults.
const (
	DefaultFailureThreshold   = 5
	PDFailureThreshold        = 3
	DefaultOriginErrThreshold = 3
	DefaultBreakerOpenFor     = 30 * time.Second
	DefaultHalfOpenTrials     = 3
)

// DefaultBreakerConfig is the breaker of a rule; pd selects the P/D threshold.
func DefaultBreakerConfig(pd bool) BreakerConfig {
	c := BreakerConfig{FailureThreshold: DefaultFailureThreshold, OriginErrThreshold: DefaultOriginErrThreshold,
		OpenFor: DefaultBreakerOpenFor, HalfOpenTrials: DefaultHalfOpenTrials}
	if pd {
		c.FailureThreshold = PDFailureThreshold
	}
	return c
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	if c.OriginErrThreshold < 0 {
		c.OriginErrThreshold = 0
	}
	if c.OpenFor <= 0 {
		c.OpenFor = DefaultBreakerOpenFor
	}
	if c.HalfOpenTrials <= 0 {
		c.HalfOpenTrials = DefaultHalfOpenTrials
	}
	return c
}

// breaker is one endpoint's circuit breaker. Not safe for concurrent use;
// the Tracker serialises it.
type breaker struct {
	state    BreakerState
	failures int // consecutive connect failures
	origin   int // consecutive origin 5xx
	openedAt time.Time
	halfAt   time.Time // when the current half-open trial window began
	trials   int       // requests admitted while half-open
}

// due reports whether an open breaker's open time has passed.
func (b *breaker) due(c BreakerConfig, now time.Time) bool {
	return b.state == BreakerOpen && !now.Before(b.openedAt.Add(c.OpenFor))
}

// tick moves an open breaker whose time is up to half-open; it reports
// whether the state changed.
func (b *breaker) tick(c BreakerConfig, now time.Time) bool {
	if b.due(c, now) {
		b.state, b.trials, b.halfAt = BreakerHalfOpen, 0, now
		return true
	}
	return false
}

// renewDue is when a half-open breaker whose trials are all used but never
// reported gets a fresh trial window (a lost trial must not exclude the
// endpoint for ever); zero when not applicable.
func (b *breaker) renewDue(c BreakerConfig) time.Time {
	if b.state == BreakerHalfOpen && b.trials >= c.HalfOpenTrials {
		return b.halfAt.Add(c.OpenFor)
	}
	return time.Time{}
}

// renew opens a fresh trial window when renewDue has passed; it reports
// whether anything changed.
func (b *breaker) renew(c BreakerConfig, now time.Time) bool {
	if d := b.renewDue(c); !d.IsZero() && !now.Before(d) {
		b.trials, b.halfAt = 0, now
		return true
	}
	return false
}

// blocks reports whether the breaker refuses new requests now (after tick).
func (b *breaker) blocks(c BreakerConfig) bool {
	return b.state == BreakerOpen || (b.state == BreakerHalfOpen && b.trials >= c.HalfOpenTrials)
}

// allow admits one request: always when closed, up to HalfOpenTrials when
// half-open, never when open.
func (b *breaker) allow(c BreakerConfig, now time.Time) bool {
	b.tick(c, now)
	b.renew(c, now)
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		if b.trials < c.HalfOpenTrials {
			b.trials++
			return true
		}
	}
	return false
}

// success records a successful request; a half-open breaker closes. It
// returns whether the state changed.
func (b *breaker) success() bool {
	b.failures, b.origin = 0, 0
	if b.state == BreakerHalfOpen {
		b.state, b.trials = BreakerClosed, 0
		return true
	}
	return false
}

func (b *breaker) open(now time.Time) {
	b.state, b.openedAt, b.trials = BreakerOpen, now, 0
	b.failures, b.origin = 0, 0
}

// failure records a connect failure (origin false) or an origin 5xx
// (origin true). A half-open breaker reopens; a closed one opens at its
// threshold. It returns whether the state changed.
func (b *breaker) failure(c BreakerConfig, now time.Time, origin bool) bool {
	switch b.state {
	case BreakerHalfOpen:
		b.open(now)
		return true
	case BreakerOpen:
		return false
	}
	if origin {
		if c.OriginErrThreshold == 0 {
			return false
		}
		b.origin++
		if b.origin >= c.OriginErrThreshold {
			b.open(now)
			return true
		}
		return false
	}
	b.failures++
	if b.failures >= c.FailureThreshold {
		b.open(now)
		return true
	}
	return false
}
