// Package attempt is kvgate's one retry policy for a request leg: a bounded
// number of tries, the endpoint of a failed try excluded from the next, the
// circuit breaker asked before each try and told how it went, and every
// connect failure accounted once. The plain forward (pkg/fullproxy) and both
// legs of the P/D flow (pkg/pd) run their tries through a Loop, so a retry
// means the same thing, and is counted the same way, on every path
// (docs/dataplane.md, "Attempt policy").
package attempt

import "github.com/kvgate/kvgate/pkg/epset"

// Breaker is the per-endpoint circuit breaker a Loop drives;
// *health.Tracker implements it.
type Breaker interface {
	// Allow reports whether a request may go to ep now (false while the
	// breaker is open, or half-open with its trials in use).
	Allow(ep int) bool
	Success(ep int)
	ConnectFailure(ep int)
	OriginError(ep int)
}

// Loop is one request's tries on one leg. The zero value is not usable;
// make one with New. A Loop is not safe for concurrent use (one request).
type Loop struct {
	max      int
	breaker  Breaker
	connect  func(ep int)
	tries    int
	excluded epset.Set
	failed   []int
	rerouted bool // a try already moved off an endpoint that went down
}

// New returns a loop of at most tries tries (at least one). breaker may be
// nil (every endpoint allowed, nothing fed back); connectFailed, when not
// nil, accounts each connect failure (the proxy's metric and access log).
func New(tries int, breaker Breaker, connectFailed func(ep int)) *Loop {
	return &Loop{max: max(tries, 1), breaker: breaker, connect: connectFailed}
}

// Next starts another try and reports whether the bound allows it.
func (l *Loop) Next() bool {
	if l.tries >= l.max {
		return false
	}
	l.tries++
	return true
}

// Tries is the number of tries started so far.
func (l *Loop) Tries() int { return l.tries }

// Max is the bound on tries.
func (l *Loop) Max() int { return l.max }

// Last reports whether the current try is the last one the bound allows.
func (l *Loop) Last() bool { return l.tries >= l.max }

// Excluded is the set of endpoints a try failed on (or the breaker
// refused); the next decision must skip them.
func (l *Loop) Excluded() epset.Set { return l.excluded }

// ConnectFailures lists the endpoints that refused a connection, in order.
func (l *Loop) ConnectFailures() []int { return l.failed }

// Admit asks the breaker whether ep may take this try. A refusal excludes
// ep; the try is spent like a failed one (the caller continues with Next).
func (l *Loop) Admit(ep int) bool {
	if l.breaker == nil || l.breaker.Allow(ep) {
		return true
	}
	l.excluded.Add(ep)
	return false
}

// ConnectFailed records that ep refused the connection: excluded, fed to
// the breaker, accounted.
func (l *Loop) ConnectFailed(ep int) {
	l.excluded.Add(ep)
	l.failed = append(l.failed, ep)
	if l.breaker != nil {
		l.breaker.ConnectFailure(ep)
	}
	if l.connect != nil {
		l.connect(ep)
	}
}

// Died records that ep failed after the connection was made (it closed or
// broke before a usable answer): excluded and fed to the breaker as a
// connection failure, without counting as a refused connection.
func (l *Loop) Died(ep int) {
	l.excluded.Add(ep)
	if l.breaker != nil {
		l.breaker.ConnectFailure(ep)
	}
}

// Down records that ep went down (its health probe failed) while the try
// waited for ep's first response byte: ep is excluded, and the breaker is
// not told (the probe state already keeps ep out of selection). It reports
// whether the request may be re-routed: once per request, and only while
// the bound leaves a try; the caller also needs a replayable request.
func (l *Loop) Down(ep int) (reroute bool) {
	l.excluded.Add(ep)
	if l.rerouted || l.tries >= l.max {
		return false
	}
	l.rerouted = true
	return true
}

// Rerouted reports whether a try moved off an endpoint that went down.
func (l *Loop) Rerouted() bool { return l.rerouted }

// OriginError records a 5xx (or an unusable answer) from ep: excluded and
// fed to the breaker as an origin error.
func (l *Loop) OriginError(ep int) {
	l.excluded.Add(ep)
	if l.breaker != nil {
		l.breaker.OriginError(ep)
	}
}

// Answered feeds ep's response status to the breaker: a 5xx is an origin
// error, anything else a success. It excludes nothing: the answer goes to
// the client.
func (l *Loop) Answered(ep, status int) {
	if l.breaker == nil {
		return
	}
	if status >= 500 {
		l.breaker.OriginError(ep)
	} else {
		l.breaker.Success(ep)
	}
}
