package ingest

import (
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// parityRecorder is a ParityObserver that tallies what it is told.
type parityRecorder struct {
	mu        sync.Mutex
	checked   int
	unchecked map[string]int
	mismatch  map[string]int
	state     int
}

func newParityRecorder() *parityRecorder {
	return &parityRecorder{unchecked: map[string]int{}, mismatch: map[string]int{}}
}

func (r *parityRecorder) ParityChecked(EndpointRef) { r.mu.Lock(); r.checked++; r.mu.Unlock() }
func (r *parityRecorder) ParityUnchecked(_ EndpointRef, c string) {
	r.mu.Lock()
	r.unchecked[c]++
	r.mu.Unlock()
}
func (r *parityRecorder) ParityMismatch(_ EndpointRef, reason string) {
	r.mu.Lock()
	r.mismatch[reason]++
	r.mu.Unlock()
}
func (r *parityRecorder) ParityState(_ EndpointRef, s int) { r.mu.Lock(); r.state = s; r.mu.Unlock() }

func (r *parityRecorder) mismatches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.mismatch {
		n += v
	}
	return n
}

// engineEvent is a BlockStored as an engine with contract c publishes it for
// tokens (hashLora: whether the LoRA name enters the hashes).
func engineEvent(t testing.TB, c kvhash.Contract, tokens []uint32, lora string, hashLora bool) kvevents.Event {
	t.Helper()
	h, err := kvhash.New(c)
	if err != nil {
		t.Fatal(err)
	}
	extra := kvhash.Extra{}
	if hashLora {
		extra.LoRAName = lora
	}
	hs := h.AppendHashes(nil, tokens, extra)
	return kvevents.Event{Type: kvevents.BlockStored, BlockHashes: hs, TokenIDs: tokens[:len(hs)*c.BlockSize],
		BlockSize: c.BlockSize, HasBlockSize: true, Medium: "GPU", HasMedium: true, LoRAName: lora, HasLoRAName: lora != "",
		HasGroupIdx: true, KVCacheSpecKind: "full_attention"}
}

func payloadOf(t testing.TB, evs ...kvevents.Event) []byte {
	t.Helper()
	p, err := kvevents.AppendEncode(nil, &kvevents.Batch{TS: 1, Events: evs, HasRank: true}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func randTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(150000))
	}
	return out
}

func waitParity(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 { // bounded: 20 s
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestParityDetectsMismatches(t *testing.T) {
	rule := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	with := func(f func(*kvhash.Contract)) kvhash.Contract { c := rule; f(&c); return c }
	cases := []struct {
		name     string
		engine   kvhash.Contract
		lora     string
		noLora   bool // the engine does not hash the LoRA name
		reason   string
		sentence string
	}{
		{name: "match", engine: rule},
		{name: "match-lora", engine: rule, lora: "sql-lora"},
		{name: "seed", engine: with(func(c *kvhash.Contract) { c.Seed = kvhash.SeedOf("1") }), reason: ParitySeed,
			sentence: "engine 10.0.0.2 hashes with PYTHONHASHSEED=1; kvgate has LLB_KV_NONE_HASH_SEED=0"},
		{name: "seed-unset", engine: with(func(c *kvhash.Contract) { c.Seed = kvhash.Seed{} }), reason: ParitySeed,
			sentence: "PYTHONHASHSEED=unset; kvgate has LLB_KV_NONE_HASH_SEED=0"},
		{name: "algo", engine: with(func(c *kvhash.Contract) { c.Algo = kvhash.XXHashCBOR }), reason: ParityAlgo,
			sentence: "--prefix-caching-hash-algo xxhash_cbor; the rule has kvHashAlgo=sha256_cbor"},
		{name: "algo-pickle", engine: with(func(c *kvhash.Contract) { c.Algo = kvhash.SHA256 }), reason: ParityAlgo,
			sentence: "--prefix-caching-hash-algo sha256;"},
		{name: "block-size-multiple", engine: with(func(c *kvhash.Contract) { c.BlockSize = 32 }), reason: ParityBlockSize,
			sentence: "hashes blocks of 32 tokens"},
		{name: "block-size-not-multiple", engine: with(func(c *kvhash.Contract) { c.BlockSize = 24 }), reason: ParityBlockSize,
			sentence: "publishes block_size 24, not a multiple of the rule's kvBlockSize=16"},
		{name: "lora", engine: rule, lora: "sql-lora", noLora: true, reason: ParityLoRA, sentence: `does not hash its LoRA name`},
		{name: "random-none-hash", engine: with(func(c *kvhash.Contract) { c.Algo = kvhash.XXHash; c.Seed = kvhash.SeedOf("f00d-random") }),
			reason: ParityUnknown, sentence: "random NONE_HASH"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := kvhash.New(rule)
			if err != nil {
				t.Fatal(err)
			}
			rec := newParityRecorder()
			var logs syncBuffer
			p := NewParity(ParityOptions{Service: 7, Hasher: h, Observer: rec,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			in := &Ingester{Inventory: ix, EPIdx: 1, Granularity: NewGranularity(16)}
			in.EnableParity(p, EndpointRef{Service: 7, EPIdx: 1, IP: "10.0.0.2"})
			r := rand.New(rand.NewPCG(3, uint64(len(tc.name))))
			ev := engineEvent(t, tc.engine, randTokens(r, 4*tc.engine.BlockSize), tc.lora, !tc.noLora)
			// One BlockStored decides.
			if _, err := in.Apply(payloadOf(t, ev)); err != nil {
				t.Fatal(err)
			}
			if tc.reason == "" {
				if rec.checked != 1 || rec.mismatches() != 0 || rec.state != 1 {
					t.Fatalf("matched setup: checked=%d mismatch=%v state=%d", rec.checked, rec.mismatch, rec.state)
				}
				return
			}
			waitParity(t, "the mismatch to be counted", func() bool { return rec.mismatches() == 1 })
			rec.mu.Lock()
			got := rec.mismatch[tc.reason]
			rec.mu.Unlock()
			if got != 1 {
				t.Fatalf("mismatch reasons %v, want 1 × %s", rec.mismatch, tc.reason)
			}
			waitParity(t, "the diagnosis log", func() bool { return strings.Contains(logs.String(), "kv parity") })
			if !strings.Contains(logs.String(), tc.sentence) {
				t.Fatalf("log does not name the fix %q:\n%s", tc.sentence, logs.String())
			}
			// Three consecutive mismatches: broken. Later events of the same
			// setup take the diagnosed reason without a new search.
			for range 2 {
				ev := engineEvent(t, tc.engine, randTokens(r, 4*tc.engine.BlockSize), tc.lora, !tc.noLora)
				if _, err := in.Apply(payloadOf(t, ev)); err != nil {
					t.Fatal(err)
				}
			}
			waitParity(t, "three mismatches", func() bool { return rec.mismatches() == 3 })
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.state != -1 || rec.mismatch[tc.reason] != 3 {
				t.Fatalf("after 3 mismatches: state=%d reasons=%v, want -1 and 3 × %s", rec.state, rec.mismatch, tc.reason)
			}
			st := p.Status()
			if len(st) != 1 || st[0].State != -1 || !strings.Contains(st[0].Diagnosis, tc.sentence) {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

func TestParityUncheckedAndChained(t *testing.T) {
	rule := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	h, err := kvhash.New(rule)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 5))
	full := engineEvent(t, rule, randTokens(r, 64), "", true) // 4 blocks
	first, second := full, full
	first.BlockHashes, first.TokenIDs = full.BlockHashes[:2], full.TokenIDs[:32]
	second.BlockHashes, second.TokenIDs = full.BlockHashes[2:], full.TokenIDs[32:]
	second.ParentBlockHash, second.HasParent = full.BlockHashes[1], true
	orphan := second
	orphan.ParentBlockHash = 12345
	noTokens := full
	noTokens.TokenIDs = nil

	cases := []struct {
		name      string
		budget    int
		events    []kvevents.Event
		checked   int
		unchecked map[string]int
	}{
		{name: "chained-from-cached-parent", events: []kvevents.Event{first, second}, checked: 2, unchecked: map[string]int{}},
		{name: "parent-unknown", events: []kvevents.Event{orphan}, unchecked: map[string]int{UncheckedParentUnknown: 1}},
		{name: "no-token-ids", events: []kvevents.Event{noTokens}, unchecked: map[string]int{UncheckedNoTokenIDs: 1}},
		{name: "first-8-always-then-sampled", budget: -1,
			events:    []kvevents.Event{full, full, full, full, full, full, full, full, full, full},
			checked:   8,
			unchecked: map[string]int{UncheckedSampledOut: 2}},
		{name: "budget-bounds-checks", budget: 64, // 9th event fits the bucket (64 blocks), later ones drain it
			events:  []kvevents.Event{full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full, full},
			checked: 8 + 16, unchecked: map[string]int{UncheckedSampledOut: 6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newParityRecorder()
			now := time.Unix(1000, 0)
			p := NewParity(ParityOptions{Hasher: h, Observer: rec, Budget: tc.budget, Now: func() time.Time { return now }})
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			in := &Ingester{Inventory: ix, EPIdx: 0}
			in.EnableParity(p, EndpointRef{EPIdx: 0, IP: "10.0.0.3"})
			for _, ev := range tc.events {
				if _, err := in.Apply(payloadOf(t, ev)); err != nil {
					t.Fatal(err)
				}
			}
			if rec.checked != tc.checked || rec.mismatches() != 0 {
				t.Fatalf("checked=%d mismatch=%v, want %d and none", rec.checked, rec.mismatch, tc.checked)
			}
			for k, v := range tc.unchecked {
				if rec.unchecked[k] != v {
					t.Fatalf("unchecked %v, want %v", rec.unchecked, tc.unchecked)
				}
			}
			// A reconnect reopens the always-check window.
			in.Connected()
			if _, err := in.Apply(payloadOf(t, full)); err != nil {
				t.Fatal(err)
			}
			if rec.checked != tc.checked+1 {
				t.Fatalf("after reconnect: checked=%d, want %d", rec.checked, tc.checked+1)
			}
		})
	}
}

// TestParitySaltedFirstBlock: a request's cache_salt reaches the hash of its
// block 0 only, and the event carries it in extra_keys; the check must use it
// rather than call a salted request a mismatch.
func TestParitySaltedFirstBlock(t *testing.T) {
	rule := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	h, _ := kvhash.New(rule)
	r := rand.New(rand.NewPCG(11, 11))
	cases := []struct {
		name, lora, salt string
		extraKeys        []byte // raw msgpack
		checked          int
		unchecked        string
	}{
		// [["s3cret"], nil, nil]
		{name: "salt", salt: "s3cret", extraKeys: []byte{0x93, 0x91, 0xa6, 's', '3', 'c', 'r', 'e', 't', 0xc0, 0xc0}, checked: 1},
		// [["ad", "s3cret"], ["ad"], ["ad"]]
		{name: "lora-and-salt", lora: "ad", salt: "s3cret", extraKeys: []byte{0x93, 0x92, 0xa2, 'a', 'd', 0xa6, 's', '3', 'c', 'r', 'e', 't',
			0x91, 0xa2, 'a', 'd', 0x91, 0xa2, 'a', 'd'}, checked: 1},
		// [[[1, 2]], nil, nil]: a multimodal key, not a string
		{name: "multimodal", extraKeys: []byte{0x93, 0x91, 0x92, 0x01, 0x02, 0xc0, 0xc0}, unchecked: UncheckedNoTokenIDs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newParityRecorder()
			p := NewParity(ParityOptions{Hasher: h, Observer: rec})
			ix, _ := inventory.New(inventory.Options{})
			in := &Ingester{Inventory: ix}
			in.EnableParity(p, EndpointRef{IP: "10.0.0.5"})
			tokens := randTokens(r, 48)
			ev := engineEvent(t, rule, tokens, tc.lora, true)
			ev.BlockHashes = h.AppendHashes(nil, tokens, kvhash.Extra{LoRAName: tc.lora, CacheSalt: tc.salt})
			ev.ExtraKeys = tc.extraKeys
			if _, err := in.Apply(payloadOf(t, ev)); err != nil {
				t.Fatal(err)
			}
			if rec.checked != tc.checked || rec.mismatches() != 0 || (tc.unchecked != "" && rec.unchecked[tc.unchecked] != 1) {
				t.Fatalf("checked=%d mismatch=%v unchecked=%v", rec.checked, rec.mismatch, rec.unchecked)
			}
		})
	}
}

func TestParityStateRecovers(t *testing.T) {
	rule := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	h, _ := kvhash.New(rule)
	rec := newParityRecorder()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := NewParity(ParityOptions{Hasher: h, Observer: rec, Now: clock, Logger: slog.New(slog.NewTextHandler(&syncBuffer{}, nil))})
	ix, _ := inventory.New(inventory.Options{})
	in := &Ingester{Inventory: ix}
	in.EnableParity(p, EndpointRef{IP: "10.0.0.4"})
	r := rand.New(rand.NewPCG(9, 9))
	bad := with1(rule)
	steps := []struct {
		c       kvhash.Contract
		advance time.Duration
		state   int
	}{
		{bad, 0, 0}, {bad, 0, 0}, {bad, 0, -1},
		{rule, time.Second, 0},      // a match ends the streak, but a mismatch was 1 s ago
		{rule, 61 * time.Second, 1}, // a match with no mismatch for 60 s
	}
	for i, s := range steps {
		mu.Lock()
		now = now.Add(s.advance)
		mu.Unlock()
		in.Connected()
		if _, err := in.Apply(payloadOf(t, engineEvent(t, s.c, randTokens(r, 48), "", true))); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		got := rec.state
		rec.mu.Unlock()
		if got != s.state {
			t.Fatalf("step %d: state %d, want %d", i, got, s.state)
		}
	}
}

func with1(c kvhash.Contract) kvhash.Contract { c.Seed = kvhash.SeedOf("1"); return c }

// FuzzFirstBlockSalt: extra_keys come from the wire; any bytes must give an
// answer, never a panic or a read past the input.
func FuzzFirstBlockSalt(f *testing.F) {
	for _, seed := range [][]byte{
		nil, {0xc0}, {0x93, 0x91, 0xa1, 'x', 0xc0, 0xc0}, {0x91, 0x92, 0xa2, 'a', 'd', 0xa1, 's'},
		{0xdd, 0xff, 0xff, 0xff, 0xff}, {0x91, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0xa1}, {0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff},
		{0x91, 0x91, 0xd9}, {0x91, 0x91, 0x01},
	} {
		f.Add(seed, "ad")
	}
	f.Fuzz(func(t *testing.T, raw []byte, lora string) {
		salt, ok := firstBlockSalt(raw, lora)
		if len(salt) > len(raw) || (!ok && salt != "") {
			t.Fatalf("salt %q ok %v from %x", salt, ok, raw)
		}
	})
}

// TestParityCoarserGroupBlocks: a KV-cache group of 32-token blocks over a
// 16-token hash block (prefix_match_unit) publishes every 2nd hash of the
// fine chain; that is a match, and a count of token ids that does not fit
// the hashes is a granularity mismatch.
func TestParityCoarserGroupBlocks(t *testing.T) {
	rule := kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")}
	h, _ := kvhash.New(rule)
	r := rand.New(rand.NewPCG(13, 13))
	tokens := randTokens(r, 128)
	good := engineEvent(t, rule, tokens, "", true)
	good.BlockHashes = EveryKth(h.AppendHashes(nil, tokens, kvhash.Extra{}), 2)
	good.BlockSize = 32
	short := good
	short.TokenIDs = tokens[:100]
	cases := []struct {
		name     string
		ev       kvevents.Event
		mismatch string
	}{
		{"every-2nd-hash", good, ""},
		{"token-count-off", short, ParityGranularity},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newParityRecorder()
			p := NewParity(ParityOptions{Hasher: h, Observer: rec, Logger: slog.New(slog.DiscardHandler)})
			ix, _ := inventory.New(inventory.Options{})
			in := &Ingester{Inventory: ix, Granularity: NewGranularity(16)}
			in.EnableParity(p, EndpointRef{IP: "10.0.0.6"})
			if _, err := in.Apply(payloadOf(t, tc.ev)); err != nil {
				t.Fatal(err)
			}
			if tc.mismatch == "" {
				if rec.checked != 1 || rec.mismatches() != 0 {
					t.Fatalf("checked=%d mismatch=%v", rec.checked, rec.mismatch)
				}
				return
			}
			if rec.mismatch[tc.mismatch] != 1 {
				t.Fatalf("mismatch=%v, want %s", rec.mismatch, tc.mismatch)
			}
		})
	}
}
