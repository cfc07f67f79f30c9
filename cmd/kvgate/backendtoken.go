package main

import (
	"fmt"
	"path/filepath"
)

// defaultBackendTokenDir is where the engines' keys live unless
// --backend-token-dir says otherwise (docs/security.md).
const defaultBackendTokenDir = "/etc/kvgate/backend-tokens"

// backendTokenDir checks --backend-token-dir: an absolute directory path,
// where "/" means any file. It returns the value for gateway.Options ("" for
// any path).
func backendTokenDir(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("--backend-token-dir %q: want an absolute directory (/ allows any path)", dir)
	}
	if d := filepath.Clean(dir); d != "/" {
		return d, nil
	}
	return "", nil
}
