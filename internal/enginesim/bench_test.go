package enginesim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// BenchmarkCompletion measures the simulator's own overhead per request
// (timing model off): HTTP, hashing, the engine loop and event encoding, for
// a cold and a warm 1024-token prompt.
func BenchmarkCompletion(b *testing.B) {
	for _, warm := range []bool{false, true} {
		name := "cold"
		if warm {
			name = "warm"
		}
		b.Run(name, func(b *testing.B) {
			host := "127.0.0.1"
			e, err := New(Config{Host: host, Port: 0, KVEventsEndpoint: "tcp://" + host + ":0", ReplayEndpoint: "none",
				Logger: quietLogger(), HashSeedSet: true, NumGPUBlocks: 1 << 16})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			client := &http.Client{}
			prompt := seqIDs(0, 1024)
			b.ResetTimer()
			for i := range b.N {
				if !warm {
					prompt[0] = uint32(i) // a new first block: nothing cached
				}
				body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 4})
				resp, err := client.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}

// BenchmarkBlockPool measures admission + caching + free of a 64-block
// request against a pool that must evict.
func BenchmarkBlockPool(b *testing.B) {
	p, _ := newBlockPool(1024)
	chains := make([][]blockHash, 64)
	for i := range chains {
		chains[i] = fakeChain(byte(i), 64)
	}
	b.ResetTimer()
	for i := range b.N {
		chain := chains[i%len(chains)]
		hit := p.lookup(chain)
		ids := p.acquireHits(chain, hit)
		p.reserve(len(chain) - hit)
		for range len(chain) - hit {
			id, _ := p.allocate()
			ids = append(ids, id)
		}
		p.cacheFull(ids[hit:], chain[hit:], nil, nil, kvhash.Extra{}, hit)
		p.free(ids)
		p.takeEvents()
	}
}
