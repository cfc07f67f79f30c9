package api

import (
	"github.com/kvgate/kvgate/pkg/apiauth"
	"github.com/kvgate/kvgate/pkg/config"
)

// checkBackendTokenFile refuses a rule whose backendTokenFile kvgate could
// not use: missing, not a regular file, readable by group or others, owned
// by another user, or holding no token. The engines' key is a secret like
// the API token file, so the same rules apply; the message names the file
// and its mode, never the token (docs/security.md).
func checkBackendTokenFile(r *config.Rule) error {
	path := r.Args.BackendTokenFile
	if path == "" {
		return nil
	}
	if _, err := apiauth.LoadBackendTokenFile(path); err != nil {
		const field = "serviceArguments.backendTokenFile"
		return &config.ValidationError{Field: field, Msg: field + ": " + err.Error()}
	}
	return nil
}
