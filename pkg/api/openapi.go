package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/docs"
)

// openAPIJSON converts docs/openapi.yaml to JSON, once per server.
func (s *Server) openAPIJSON() ([]byte, error) {
	s.openAPIOnce.Do(func() {
		var doc any
		if err := yaml.Unmarshal(docs.OpenAPIYAML(), &doc); err != nil {
			s.openAPIErr = fmt.Errorf("docs/openapi.yaml: %w", err)
			return
		}
		s.openAPI, s.openAPIErr = json.Marshal(doc)
	})
	return s.openAPI, s.openAPIErr
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	b, err := s.openAPIJSON()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
