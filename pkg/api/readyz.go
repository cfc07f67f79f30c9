package api

import (
	"net/http"
	"slices"
)

// readyBody is GET /readyz: {"ready":true,"pending":[]} with 200, or
// {"ready":false,"pending":[models]} with 503 while staged tokenizers load
// (docs/api.md "Readiness").
type readyBody struct {
	Ready   bool     `json:"ready"`
	Pending []string `json:"pending"`
}

func (s *Server) handleReadyz(w http.ResponseWriter, _ *http.Request) {
	body := readyBody{Ready: true, Pending: []string{}}
	if s.opts.Readiness != nil {
		ready, pending := s.opts.Readiness.Ready()
		body.Ready = ready
		if len(pending) > 0 {
			body.Pending = slices.Sorted(slices.Values(pending))
		}
	}
	status := http.StatusOK
	if !body.Ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, body)
}
