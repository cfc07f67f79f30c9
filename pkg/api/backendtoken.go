package api

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kvgate/kvgate/pkg/apiauth"
	"github.com/kvgate/kvgate/pkg/config"
)

const backendTokenField = "serviceArguments.backendTokenFile"

func backendTokenInvalid(format string, args ...any) error {
	return &config.ValidationError{Field: backendTokenField, Msg: backendTokenField + ": " + fmt.Sprintf(format, args...)}
}

// checkBackendTokenFile refuses a rule whose backendTokenFile kvgate could
// not use: outside --backend-token-dir, missing, not a regular file,
// readable by group or others, owned by another user, or holding no token.
// The engines' key is a secret like the API token file, so the same mode
// rules apply; the message names the file and its mode, never the token
// (docs/security.md).
func (s *Server) checkBackendTokenFile(r *config.Rule) error {
	path := r.Args.BackendTokenFile
	if path == "" {
		return nil
	}
	// The directory check comes first: kvgate reads the file as its own
	// (often root) user and sends its first line to endpoints the rule's
	// author chose, so a path outside the directory is refused before the
	// file is even looked at, and the answer says nothing about it.
	if err := inBackendTokenDir(path, s.opts.BackendTokenDir); err != nil {
		return err
	}
	if _, err := apiauth.LoadBackendTokenFile(path); err != nil {
		return backendTokenInvalid("%v", err)
	}
	return nil
}

// inBackendTokenDir checks that path lies in dir ("" allows any path), both
// as written and with symlinks resolved (a Kubernetes Secret's ..data links
// stay inside its mount; a link to /root does not).
func inBackendTokenDir(path, dir string) error {
	if dir == "" {
		return nil
	}
	if !within(filepath.Clean(path), filepath.Clean(dir)) {
		return backendTokenInvalid("%s is outside the backend token directory %s (--backend-token-dir)", path, dir)
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil // a missing file is named by the load that follows
	}
	resolvedDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		resolvedDir = filepath.Clean(dir)
	}
	if !within(resolved, resolvedDir) {
		return backendTokenInvalid("%s leads outside the backend token directory %s (--backend-token-dir)", path, dir)
	}
	return nil
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
