package api

import (
	"io"
	"math/rand/v2"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

// BenchmarkInventory1M measures GET …/kv/inventory for an endpoint holding
// one million blocks (the default LOXILB_KV_MAX_BLOCKS): clone, sort, stream.
func BenchmarkInventory1M(b *testing.B) {
	hashes := make([]uint64, 1_000_000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range hashes {
		hashes[i] = rng.Uint64()
	}
	srv := New(Options{Settings: config.DefaultSettings(), Inventory: mapInventory{{1, 0}: hashes}, Log: quiet()})
	r := &config.Rule{Args: config.ServiceArguments{ExternalIP: "10.0.0.1", Port: 80, Mode: 4, KVExactMode: 3},
		Endpoints: []config.Endpoint{{IP: "10.0.0.2", TargetPort: 80}}}
	if _, err := srv.Apply(r, nil); err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	b.ResetTimer()
	var n int64
	for i := 0; i < b.N; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/netlox/v1/config/ai/kv/inventory?service_id=1&ep_idx=0", nil))
		n = int64(rec.Body.Len())
		_, _ = io.Copy(io.Discard, rec.Body)
	}
	b.SetBytes(n)
}
