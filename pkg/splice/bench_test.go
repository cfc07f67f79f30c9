//go:build linux

package splice

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// BenchmarkBodyLeg compares the two legs side by side in one run: a 64 MiB
// bulk body (throughput) and 200 concurrent SSE streams (time per chunk of
// the whole in-process system: backend, proxy and client share the CPUs).
// The cross-process figures with nginx and kernel-thread CPU are in
// bench/datapath.
func BenchmarkBodyLeg(b *testing.B) {
	d := openTest(b, Config{})
	be := startBackend(b, "127.0.0.1:0")
	for _, leg := range []datapath.BodyLeg{datapath.NewUserspace(0), d} {
		b.Run("bulk64MiB/"+leg.Path(), func(b *testing.B) {
			p := startProxy(b, leg, func(string) string { return be.addr() })
			cl := dialClient(b, p.ln.Addr().String())
			const n = 64 << 20
			b.SetBytes(n)
			for i := 0; i < b.N; i++ {
				if _, got, err := cl.get(fmt.Sprintf("/bulk?n=%d&delay=2000", n)); err != nil || got != n {
					b.Fatalf("got %d bytes: %v", got, err)
				}
				<-p.results
			}
		})
		b.Run("sse200x100/"+leg.Path(), func(b *testing.B) {
			p := startProxy(b, leg, func(string) string { return be.addr() })
			const streams, chunks = 200, 100
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				for s := 0; s < streams; s++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						cl := dialClient(b, p.ln.Addr().String())
						if _, _, err := cl.get(fmt.Sprintf("/sse?chunks=%d&gap=2000&seed=%d", chunks, s)); err != nil {
							b.Error(err)
						}
						cl.c.Close()
					}()
				}
				wg.Wait()
				for s := 0; s < streams; s++ {
					<-p.results
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*streams*chunks), "ns/chunk")
		})
	}
}
