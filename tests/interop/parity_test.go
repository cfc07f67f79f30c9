package interop

import (
	"bytes"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/internal/testpy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// parityTally records the parity self-check's verdicts.
type parityTally struct {
	mu       sync.Mutex
	checked  int
	mismatch map[string]int
	state    int
}

func (p *parityTally) ParityChecked(ingest.EndpointRef)           { p.mu.Lock(); p.checked++; p.mu.Unlock() }
func (p *parityTally) ParityUnchecked(ingest.EndpointRef, string) {}
func (p *parityTally) ParityMismatch(_ ingest.EndpointRef, r string) {
	p.mu.Lock()
	p.mismatch[r]++
	p.mu.Unlock()
}
func (p *parityTally) ParityState(_ ingest.EndpointRef, s int) {
	p.mu.Lock()
	p.state = s
	p.mu.Unlock()
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// TestLibzmqParitySelfCheck: BlockStored events from a real libzmq publisher
// on topic "kv-events", in both replay layouts, the first batch delivered by
// the bootstrap replay and the rest live. The events of an engine whose seed
// differs from kvgate's are named "seed" on the first one, with the fix in the
// log; a matched engine's pass and set the state to 1.
func TestLibzmqParitySelfCheck(t *testing.T) {
	testpy.Require(t, "zmq", "msgpack")
	rule := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	ruleHasher, err := kvhash.New(rule)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		layout     string
		engineSeed string
		reason     string
	}{
		{"current", "0", ""},
		{"legacy", "0", ""},
		{"current", "1", ingest.ParitySeed},
		{"legacy", "1", ingest.ParitySeed},
	}
	for _, tc := range cases {
		t.Run(tc.layout+"-seed"+tc.engineSeed, func(t *testing.T) {
			engine, err := kvhash.New(kvhash.Contract{Algo: rule.Algo, BlockSize: 16, Seed: kvhash.SeedOf(tc.engineSeed)})
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(21, uint64(len(tc.layout))))
			payload := func() string {
				tokens := make([]uint32, 64)
				for i := range tokens {
					tokens[i] = uint32(r.IntN(150000))
				}
				ev := kvevents.Event{Type: kvevents.BlockStored, BlockHashes: engine.AppendHashes(nil, tokens, kvhash.Extra{}),
					TokenIDs: tokens, BlockSize: 16, HasBlockSize: true, Medium: "GPU", HasMedium: true, HasGroupIdx: true,
					KVCacheSpecKind: "full_attention"}
				p, err := kvevents.AppendEncode(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}, HasRank: true}, kvevents.LayoutMap)
				if err != nil {
					t.Fatal(err)
				}
				return hex.EncodeToString(p)
			}
			ip := testnet.Host(t)
			const offset = ingest.DefaultReplayPortOffset
			port := testnet.PortPair(t, ip, offset)
			py := startPython(t, "tcp://"+net.JoinHostPort(ip, strconv.Itoa(port)), "tcp://"+net.JoinHostPort(ip, strconv.Itoa(port+offset)),
				tc.layout, "kv-events")
			py.send(map[string]any{"op": "buf", "seq": 0, "payload_hex": payload()})

			tally := &parityTally{mismatch: map[string]int{}}
			logs := &lockedBuf{}
			par := ingest.NewParity(ingest.ParityOptions{Service: 1, Hasher: ruleHasher, Observer: tally,
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			mgr := ingest.NewManager(ingest.Options{ReplayPortOffset: offset, DialRetry: 50 * time.Millisecond,
				RebuildDelay: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			t.Cleanup(mgr.Close)
			if err := mgr.Reconcile([]ingest.Target{{Service: 1, EPIdx: 0, IP: ip, Port: port, Ranks: 1, Inventory: ix, Parity: par}}); err != nil {
				t.Fatal(err)
			}
			events := func() int {
				tally.mu.Lock()
				defer tally.mu.Unlock()
				n := 0
				for _, v := range tally.mismatch {
					n += v
				}
				if tc.reason == "" {
					return tally.checked
				}
				return n
			}
			wait := func(n int) {
				t.Helper()
				for range 1500 { // bounded: 15 s
					if events() >= n {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				t.Fatalf("timed out waiting for %d verdicts (checked %d, mismatches %v)", n, tally.checked, tally.mismatch)
			}
			wait(1) // the bootstrap replay's batch decides
			for seq := 1; seq <= 2; seq++ {
				py.send(map[string]any{"op": "pub", "seq": seq, "payload_hex": payload(), "topic": "kv-events"})
				wait(seq + 1)
			}
			tally.mu.Lock()
			defer tally.mu.Unlock()
			if tc.reason == "" {
				if len(tally.mismatch) != 0 || tally.state != 1 {
					t.Fatalf("matched engine: mismatches %v, state %d", tally.mismatch, tally.state)
				}
				return
			}
			if tally.mismatch[tc.reason] != 3 || tally.state != -1 {
				t.Fatalf("mismatches %v, state %d; want 3 × %s and -1", tally.mismatch, tally.state, tc.reason)
			}
			if want := "hashes with PYTHONHASHSEED=1; kvgate has LLB_KV_NONE_HASH_SEED=0"; !strings.Contains(logs.String(), want) {
				t.Fatalf("log lacks %q:\n%s", want, logs.String())
			}
		})
	}
}
