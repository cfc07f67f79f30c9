// Package recovery keeps one goroutine's panic from killing the daemon: a
// Guard recovers it, logs it with its stack through slog, counts it by where
// it happened (kvgate_panics_total{where}), and lets the rest of the process
// carry on. The goroutine's own deferred clean-up (closing its connection,
// releasing its slot) has already run by then, as a panic unwinds through
// every defer before the Guard's.
//
// A Guard is passed down like a logger, never held in a package variable; a
// nil *Guard still recovers and logs to slog.Default(), so a package whose
// caller wires none stays safe. The Where constants name what each label of
// kvgate_panics_total covers.
package recovery

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// Where values: the goroutine families kvgate starts. Metrics pre-create a
// series for each.
const (
	Conn       = "conn"       // one client connection of a rule's proxy
	API        = "api"        // one management-API request
	Subscriber = "subscriber" // a KV-event subscriber's rank or receive loop
	Replay     = "replay"     // a KV-event replay exchange
	Probe      = "probe"      // an endpoint's health-probe loop
	Scrape     = "scrape"     // an endpoint's engine-metrics scrape
	Poller     = "poller"     // any other periodic poller
)

// Wheres lists every Where value.
var Wheres = []string{Conn, API, Subscriber, Replay, Probe, Scrape, Poller}

// Observer counts recovered panics.
type Observer interface {
	Panicked(where string)
}

// Guard recovers, logs and counts panics.
type Guard struct {
	log *slog.Logger
	obs Observer
}

// New returns a Guard logging to log (nil: slog.Default()) and counting
// through obs (nil: not counted).
func New(log *slog.Logger, obs Observer) *Guard {
	return &Guard{log: log, obs: obs}
}

// Go runs fn on a new goroutine under Recover.
func (g *Guard) Go(where string, fn func()) {
	go func() {
		defer g.Recover(where)
		fn()
	}()
}

// Recover must be deferred directly (defer g.Recover(where)): it stops a
// panic in progress, logs and counts it. It returns nothing, so the
// goroutine simply ends.
func (g *Guard) Recover(where string) {
	if v := recover(); v != nil {
		g.report(where, v)
	}
}

// Run calls fn and reports whether it panicked (the panic recovered).
func (g *Guard) Run(where string, fn func()) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			g.report(where, v)
			panicked = true
		}
	}()
	fn()
	return false
}

// Handler wraps h so that a panic in one request is recovered and counted
// and the request's connection is closed without an answer (net/http's
// ErrAbortHandler semantics), instead of the server's default: log
// unstructured and go on uncounted.
func (g *Guard) Handler(where string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler { //nolint:errorlint // net/http panics with this exact value
					panic(v)
				}
				g.report(where, v)
				panic(http.ErrAbortHandler) // net/http closes the connection quietly
			}
		}()
		h.ServeHTTP(w, r)
	})
}

func (g *Guard) report(where string, v any) {
	log, obs := slog.Default(), Observer(nil)
	if g != nil {
		obs = g.obs
		if g.log != nil {
			log = g.log
		}
	}
	log.Error("recovered a panic; the goroutine ended and the process keeps serving",
		"where", where, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	if obs != nil {
		obs.Panicked(where)
	}
}
