package gateway

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
)

// BenchmarkFirstTokenizerGet measures what the first request for a staged
// model waits on the tokenizer on a fresh gateway: "cold" asks at once (what
// every first request paid before the preloader, and still pays when it
// arrives before /readyz says ready), "after-ready" asks once /readyz
// answers 200. Each iteration starts a new gateway; only the Get is timed.
// docs/api.md "Readiness" records the results.
func BenchmarkFirstTokenizerGet(b *testing.B) {
	for _, wait := range []bool{false, true} {
		name := "cold"
		if wait {
			name = "after-ready"
		}
		b.Run(name, func(b *testing.B) {
			dir := stagedQwen3(b)
			for range b.N {
				b.StopTimer()
				g, err := New(Options{Settings: config.DefaultSettings(), TokenizerDir: dir, Logger: quietLogger(), ShutdownGrace: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				if wait {
					for deadline := time.Now().Add(2 * time.Minute); ; {
						if ok, _ := g.ready.Ready(); ok {
							break
						}
						if time.Now().After(deadline) {
							b.Fatal("not ready")
						}
						time.Sleep(time.Millisecond)
					}
				}
				b.StartTimer()
				if _, err := g.pool.Get(baseModel); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				g.Shutdown()
			}
		})
	}
}
