package ingest

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/pkg/inventory"
)

func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// BenchmarkIngest measures decode + apply of vLLM map-layout payloads into
// an index that already holds ~1M blocks over 8 endpoints: each iteration
// applies one BlockStored batch and the BlockRemoved batch of the same
// hashes. "tokens" payloads carry 16 token ids per block, as vLLM sends;
// "hashes" payloads carry only the hashes. Reproduce with
//
//	go test -run '^$' -bench Ingest ./pkg/kvevents
//
// cpu-Mhash/s divides by the benchmark thread's CPU time, which the shared
// machine's load does not inflate. "tokens-parity" adds the live parity
// self-check at its default sampling budget, "tokens-parity-every" checks
// every event (the unsampled cost); checked-blocks/s is what it verified.
// The hashes are the real sha256_cbor chain of the tokens, so every check
// is a match, the common case.
func BenchmarkIngest(b *testing.B) {
	contract := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	hasher, err := kvhash.New(contract)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name       string
		withTokens bool
		budget     int // 0: no parity check
	}{
		{"hashes", false, 0},
		{"tokens", true, 0},
		{"tokens-parity", true, DefaultParityBudget},
		{"tokens-parity-every", true, 1 << 40},
	} {
		withTokens := bc.withTokens
		b.Run(bc.name, func(b *testing.B) {
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 1))
			fill := make([]uint64, 125_000)
			for e := range 8 {
				for i := range fill {
					fill[i] = r.Uint64()
				}
				if err := ix.Add(e, 0, "", fill); err != nil {
					b.Fatal(err)
				}
			}
			const pairs, blocks = 64, 256
			var stores, removes [][]byte
			for range pairs {
				hs := make([]uint64, blocks)
				for i := range hs {
					hs[i] = r.Uint64()
				}
				st := kvevents.Event{Type: kvevents.BlockStored, BlockHashes: hs, BlockSize: 16, Medium: "GPU", HasGroupIdx: true,
					KVCacheSpecKind: "full_attention"}
				if withTokens {
					st.TokenIDs = make([]uint32, 16*blocks)
					for i := range st.TokenIDs {
						st.TokenIDs[i] = uint32(r.IntN(151000))
					}
					hs = hasher.AppendHashes(hs[:0], st.TokenIDs, kvhash.Extra{})
					st.BlockHashes = hs
				}
				p, err := kvevents.AppendEncode(nil, &kvevents.Batch{TS: 1.5, Events: []kvevents.Event{st}, HasRank: true}, kvevents.LayoutMap)
				if err != nil {
					b.Fatal(err)
				}
				stores = append(stores, p)
				rm := kvevents.Event{Type: kvevents.BlockRemoved, BlockHashes: hs, Medium: "GPU", HasGroupIdx: true}
				p, err = kvevents.AppendEncode(nil, &kvevents.Batch{TS: 1.5, Events: []kvevents.Event{rm}, HasRank: true}, kvevents.LayoutMap)
				if err != nil {
					b.Fatal(err)
				}
				removes = append(removes, p)
			}
			ins := make([]*Ingester, 8)
			var checked atomic.Int64
			par := NewParity(ParityOptions{Hasher: hasher, Budget: bc.budget, Observer: countChecked{&checked}})
			for e := range ins {
				ins[e] = &Ingester{Inventory: ix, EPIdx: e}
				if bc.budget != 0 {
					ins[e].EnableParity(par, EndpointRef{EPIdx: e})
				}
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c0 := threadCPU()
			i := 0
			for b.Loop() {
				in := ins[i%8]
				if _, err := in.Apply(stores[i%pairs]); err != nil {
					b.Fatal(err)
				}
				if _, err := in.Apply(removes[i%pairs]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			hashes := float64(2 * blocks * b.N)
			b.ReportMetric(hashes/b.Elapsed().Seconds()/1e6, "Mhash/s")
			b.ReportMetric(hashes/(threadCPU()-c0).Seconds()/1e6, "cpu-Mhash/s")
			if bc.budget != 0 {
				b.ReportMetric(float64(checked.Load())*blocks/b.Elapsed().Seconds(), "checked-blocks/s")
			}
		})
	}
}

// countChecked counts checked events for the benchmark.
type countChecked struct{ n *atomic.Int64 }

func (c countChecked) ParityChecked(EndpointRef)         { c.n.Add(1) }
func (countChecked) ParityUnchecked(EndpointRef, string) {}
func (countChecked) ParityMismatch(EndpointRef, string)  {}
func (countChecked) ParityState(EndpointRef, int)        {}
