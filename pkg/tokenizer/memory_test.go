package tokenizer

import (
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkLoadedHeap reports the live heap a loaded model keeps (what an
// idle daemon holds per staged tokenizer; docs/ingest.md, "End to end").
func BenchmarkLoadedHeap(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3", "llama2"} {
		b.Run(name, func(b *testing.B) {
			var kept []*Model
			live := func() uint64 {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc
			}
			before := live()
			for i := 0; i < b.N; i++ {
				m, err := LoadModel(filepath.Join("testdata", name))
				if err != nil {
					b.Fatal(err)
				}
				kept = append(kept, m)
			}
			after := live()
			b.ReportMetric(float64(after-before)/float64(b.N)/(1<<20), "MiB/model")
			runtime.KeepAlive(kept)
		})
	}
}
