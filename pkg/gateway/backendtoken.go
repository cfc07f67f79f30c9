package gateway

import (
	"log/slog"
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/apiauth"
)

// ruleToken is a rule's backend token for the rule's whole life: the
// prober and the KV subscribers (SGLang's /get_server_info, TensorRT-LLM's
// drain) hold this one value, and a change of backendTokenFile swaps the
// file it follows, so the subscribers' targets stay equal and keep their
// inventory (docs/security.md, "Engines that require a key").
type ruleToken struct {
	log *slog.Logger
	cur atomic.Pointer[apiauth.BackendToken]
}

// follow makes the token follow path ("" none). The same path keeps the
// file's reload state; a file that fails to load is logged by apiauth and
// retried, and kvgate's calls go without a token meanwhile.
func (r *ruleToken) follow(path string) {
	if path == "" {
		r.cur.Store(nil)
		return
	}
	if cur := r.cur.Load(); cur != nil && cur.Path() == path {
		return
	}
	b, _ := apiauth.NewBackendToken(path, apiauth.DefaultReloadInterval, r.log)
	r.cur.Store(b)
}

// Token is the token in force, "" without a backendTokenFile
// (health.TokenSource, ingest.TokenSource).
func (r *ruleToken) Token() (string, error) {
	b := r.cur.Load()
	if b == nil {
		return "", nil
	}
	return b.Token()
}
