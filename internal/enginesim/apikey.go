package enginesim

// vLLM's --api-key, mirrored from its AuthenticationMiddleware
// (vllm/entrypoints/serve/utils/server_utils.py; docs/enginesim.md, "API
// key"): only paths under /v1, /v2, /inference and /cohere need
// Authorization: Bearer <key>; /health, /metrics, /tokenize, /version and
// the rest stay open, and OPTIONS is never checked. A refusal is a 401 with
// the body {"error":"Unauthorized"}.

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// guardedPrefixes are vLLM's GUARDED_PREFIX. The match is a plain string
// prefix, as vLLM's str.startswith: /v1models is guarded too.
var guardedPrefixes = []string{"/v1", "/v2", "/inference", "/cohere"}

// apiKeys holds the digests of the keys an engine accepts.
type apiKeys [][sha256.Size]byte

func newAPIKeys(keys []string) apiKeys {
	var out apiKeys
	for _, k := range keys {
		if k != "" { // vLLM drops empty keys
			out = append(out, sha256.Sum256([]byte(k)))
		}
	}
	return out
}

// refuses reports whether r must be answered 401.
func (k apiKeys) refuses(r *http.Request) bool {
	if len(k) == 0 || r.Method == http.MethodOptions || !guarded(r.URL.Path) {
		return false
	}
	return !k.verify(r.Header.Get("Authorization"))
}

func guarded(path string) bool {
	for _, p := range guardedPrefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// verify is vLLM's verify_token: the scheme is "bearer" in any case, the
// key is everything after the first space, compared in constant time over
// digests against every accepted key.
func (k apiKeys) verify(header string) bool {
	if header == "" {
		return false
	}
	scheme, param, _ := strings.Cut(header, " ")
	if !strings.EqualFold(scheme, "bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(param))
	match := 0
	for i := range k {
		match |= subtle.ConstantTimeCompare(sum[:], k[i][:])
	}
	return match == 1
}

func writeUnauthorized(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
}
