package api

import (
	"encoding/json"
	"net/http"

	"github.com/kvgate/kvgate/pkg/config"
)

// handlePatch applies an RFC 7386 JSON merge patch to a rule, as the
// reference's PATCH on the rule path does: objects merge, arrays (endpoints)
// are replaced whole, null removes a field. The result goes through the same
// validation and update path as a POST.
func (s *Server) handlePatch(w http.ResponseWriter, r *http.Request) {
	var patch any
	k, err := keyedBody(w, r, &patch)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	current, ok := s.ruleByKey(k)
	if !ok {
		s.writeErr(w, r, ruleNotFound(k))
		return
	}
	base, err := json.Marshal(struct {
		Args      config.ServiceArguments `json:"serviceArguments"`
		Endpoints []config.Endpoint       `json:"endpoints"`
	}{current.Args, current.Endpoints})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var doc any
	if err := json.Unmarshal(base, &doc); err != nil {
		s.writeErr(w, r, err)
		return
	}
	merged, err := json.Marshal(mergePatch(doc, patch))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var rule config.Rule
	if err := json.Unmarshal(merged, &rule); err != nil {
		s.writeErr(w, r, decodeError(err))
		return
	}
	if rule.Key() != k {
		s.writeErr(w, r, badRequest("serviceArguments: PATCH cannot change externalIP, port or protocol (the rule's key); delete and recreate the rule"))
		return
	}
	if err := unsupportedField(s.inspectKeys(merged)); err != nil {
		s.writeErr(w, r, err)
		return
	}
	// Admin states come from the merged document: endpoints kept from the
	// current rule carry their admin field.
	id, err := s.Apply(&rule, nil)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.log.Info("rule patched", "rule", k.String(), "service_id", id)
	writeJSON(w, http.StatusOK, successBody{Result: "Success", ServiceID: id})
}

// mergePatch is RFC 7386.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}
