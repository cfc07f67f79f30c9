package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/preflight"
)

// PreflightRunner runs the KV preflight of one rule (the gateway implements
// it; see docs/preflight.md).
type PreflightRunner interface {
	Preflight(ctx context.Context, rule *config.Rule, probe bool) preflight.Report
}

// preflightTimeout bounds one preflight: every engine call inside is bounded
// too, so this only caps a rule with many endpoints. It stays below kvctl's
// 60 s API timeout, so kvctl gets the report rather than a timeout.
const preflightTimeout = 55 * time.Second

// handlePreflight answers POST /netlox/v1/config/ai/kv/preflight?service_id=N[&probe=0]
// with the report; a failed check is a 200 with "result":"fail", while a
// preflight that cannot run is an error status with a JSON reason.
func (s *Server) handlePreflight(w http.ResponseWriter, r *http.Request) {
	bad := func(status int, msg string) { writeJSON(w, status, errorBody{Code: status, Message: msg}) }
	if s.opts.Preflight == nil {
		bad(http.StatusServiceUnavailable, "preflight is not wired in this server")
		return
	}
	q := r.URL.Query()
	sid, err := strconv.ParseUint(q.Get("service_id"), 10, 32)
	if err != nil {
		bad(http.StatusBadRequest, "invalid service_id: want a rule's service id, e.g. ?service_id=1")
		return
	}
	probe := true
	switch q.Get("probe") {
	case "", "1", "true":
	case "0", "false":
		probe = false
	default:
		bad(http.StatusBadRequest, "invalid probe: want 0 or 1")
		return
	}
	rule, ok := s.RuleByID(int(sid))
	if !ok {
		bad(http.StatusNotFound, "no rule with service_id "+strconv.FormatUint(sid, 10))
		return
	}
	if !rule.KVEnabled() {
		bad(http.StatusBadRequest, "service_id "+strconv.FormatUint(sid, 10)+" is not a KV rule (kvExactMode is 0)")
		return
	}
	if !s.preflightBusy.CompareAndSwap(false, true) {
		bad(http.StatusConflict, "a preflight is already running; retry when it ends")
		return
	}
	defer s.preflightBusy.Store(false)
	ctx, cancel := context.WithTimeout(r.Context(), preflightTimeout)
	defer cancel()
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, s.opts.Preflight.Preflight(ctx, rule, probe))
}
