package fullproxy

import (
	"time"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// Outcome is how a request ended, as kvgate_requests_total{outcome} and the
// access log's outcome field name it (docs/dataplane.md, "Decisions,
// metrics and the access log").
type Outcome uint8

const (
	// OutcomeNone: the request has not ended (never reported to Done).
	OutcomeNone Outcome = iota
	// OutcomeOK: the response went to the client in full.
	OutcomeOK
	// OutcomeClientError: the request could not be read (refused before a
	// handler saw it).
	OutcomeClientError
	// OutcomeClientGone: the client left before the response was complete.
	OutcomeClientGone
	// OutcomeSilence: the backend sent nothing for StreamSilence.
	OutcomeSilence
	// OutcomeCancelled: the server was cancelled (shutdown grace spent).
	OutcomeCancelled
	// OutcomeBackendError: the backend broke the response (reset, or a body
	// short of its declared length).
	OutcomeBackendError
	// OutcomeAnswered: kvgate answered with its own error; Record.Code is
	// the error code and the outcome's label.
	OutcomeAnswered
	// OutcomeBackendBroken: the backend closed before the body's framing
	// ended it, or broke the framing (docs/body-leg.md, "Broken
	// responses"); an origin failure for the breaker.
	OutcomeBackendBroken
)

var outcomeNames = [...]string{"", "ok", "client_error", "client_gone", "silence", "cancelled", "backend_error", "answered", "backend_broken"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// EndingOutcome maps how a body leg ended to the request's outcome; a body
// that reached backend EOF short of (or past) its declared length is a
// backend error, since the client cannot find its end.
func EndingOutcome(e datapath.Ending, truncated bool) Outcome {
	switch e {
	case datapath.BackendEOF:
		if truncated {
			return OutcomeBackendError
		}
		return OutcomeOK
	case datapath.ClientGone:
		return OutcomeClientGone
	case datapath.BackendBroken:
		return OutcomeBackendBroken
	case datapath.Silence:
		return OutcomeSilence
	case datapath.Cancelled:
		return OutcomeCancelled
	}
	return OutcomeBackendError
}

// Record describes one finished request, for metrics and the access log.
type Record struct {
	Service  string
	Method   string
	Path     string
	Remote   string
	Decision Decision
	Routed   bool // a decision was made
	Status   int  // status sent to the client (0 when none was sent)
	Outcome  Outcome
	// Code is the error code of kvgate's own answer ("" when the backend
	// answered).
	Code       string
	TTFB       time.Duration
	Duration   time.Duration
	BodyBytes  int64
	Datapath   string // body leg implementation: userspace or sockmap
	Attempts   int
	Inspected  bool
	ReqBytes   int64
	ConnectErr []int // endpoints that failed to connect
	// UsageAudited is set by a handler that audited the request's usage
	// from another leg (package pd: the prefill's answer), so the relayed
	// body is not tapped again.
	UsageAudited bool
	// TraceID is the W3C trace id of the request's traceparent header ("" when
	// absent or malformed), so a slow request can be followed into the
	// engine's own traces. The header itself is forwarded unchanged.
	TraceID string
}

// traceID extracts the trace id of a W3C traceparent value
// ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"); "" unless it is
// well formed and not all zeros. Later versions may append fields after a
// dash, which are ignored, as the W3C spec asks.
func traceID(v string) string {
	if len(v) < 55 || (len(v) > 55 && v[55] != '-') || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return ""
	}
	if v[:2] == "ff" || !isHex(v[:2]) || !isHex(v[36:52]) || !isHex(v[53:55]) {
		return ""
	}
	id := v[3:35]
	if !isHex(id) || id == "00000000000000000000000000000000" {
		return ""
	}
	return id
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// OutcomeLabel is the outcome as metrics and the access log spell it: the
// error code for a request kvgate answered itself.
func (r *Record) OutcomeLabel() string {
	if r.Outcome == OutcomeAnswered {
		return r.Code
	}
	return r.Outcome.String()
}

func (s *Server) accessLog(r *Record) {
	if s.cfg.AccessLog == nil {
		return
	}
	d := r.Decision
	s.cfg.AccessLog.Info("request",
		"service", r.Service, "remote", r.Remote, "method", r.Method, "path", r.Path,
		"model", d.Model, "prompt_tokens", d.PromptTokens, "blocks", d.Blocks,
		"tier", d.Tier, "reason", d.Reason, "score", d.Score, "ep", epLabel(r), "endpoint", d.EndpointID,
		"attempts", r.Attempts, "status", r.Status, "outcome", r.OutcomeLabel(),
		"ttfb_ms", float64(r.TTFB.Microseconds())/1000, "duration_ms", float64(r.Duration.Microseconds())/1000,
		"bytes", r.BodyBytes, "datapath", r.Datapath, "trace_id", r.TraceID)
}

func epLabel(r *Record) int {
	if !r.Routed {
		return -1
	}
	return r.Decision.Endpoint
}
