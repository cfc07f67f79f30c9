package api

import (
	"net/http"

	"github.com/kvgate/kvgate/pkg/status"
)

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	if s.opts.Status == nil {
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Code: http.StatusServiceUnavailable, Message: "status is not wired in this server"})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, s.opts.Status.Snapshot())
}

// handleStatusPage serves the status page. Its script reads the status with
// the caller's token from memory, so the page itself needs no cookie; a
// strict CSP keeps it self-contained.
func (s *Server) handleStatusPage(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(status.Page())
}

// handleHealthz answers liveness probes: the API is serving. It needs no
// token (kubelet probes carry none).
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		Status string `json:"status"`
	}{"ok"})
}
