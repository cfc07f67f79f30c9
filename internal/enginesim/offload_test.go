package enginesim

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevents"
)

// offloadTrace is what one step published, one string per event:
// "<type>/<medium> <n> hashes".
func offloadTrace(h *schedHarness) []string {
	var out []string
	for _, step := range h.events {
		for _, ev := range toWireEvents(step, h.e.cfg.BlockSize, false) {
			out = append(out, ev.Type.String()+"/"+ev.Medium)
		}
	}
	return out
}

func wireOf(r *request, from, to int) []uint64 {
	var out []uint64
	for _, h := range r.chain[from:to] {
		out = append(out, h.Wire)
	}
	return out
}

// TestCPUTierEventsAndReload follows vLLM's OffloadingConnector: a
// request's full blocks are stored in CPU memory too (BlockStored/CPU when
// the request finishes), a GPU eviction leaves the CPU copy, and a prompt
// whose blocks left the GPU reloads them from CPU (a cached hit that costs
// the reload, not a prefill) and re-stores them on the GPU.
func TestCPUTierEventsAndReload(t *testing.T) {
	for _, model := range []string{DefaultPerfModel, PerfModelSimple} {
		t.Run(model, func(t *testing.T) {
			if model == PerfModelSimple {
				testCPUTierSimple(t)
				return
			}
			h := newSchedHarness(t, Config{BlockSize: 16, NumGPUBlocks: 9, NumCPUBlocks: 16, MaxModelLen: 256})
			a := h.submit(seqIDs(1, 64), 1)
			h.runUntilIdle(100)
			aHashes := wireOf(a, 0, 4)
			b := h.submit(seqIDs(1000, 128), 1) // all 8 usable blocks: evicts A's from the GPU
			h.runUntilIdle(100)
			if h.st.pool.lookup(a.chain[:3]) != 0 {
				t.Fatal("A's blocks are still on the GPU; the test needs them evicted")
			}
			h.events = nil
			a2 := h.submit(seqIDs(1, 64), 1)
			var reloadSteps int
			for range 100 {
				plan := h.step()
				if plan == nil {
					break
				}
				if plan.load.reloadTokens > 0 {
					reloadSteps++
					if plan.load.reloadTokens != 48 || plan.load.prefillTokens != 16 {
						t.Errorf("reload step: %d reloaded, %d prefilled; want 48 and 16", plan.load.reloadTokens, plan.load.prefillTokens)
					}
				}
			}
			if reloadSteps != 1 || a2.reloadBlocks != 3 || a2.hitBlocks != 0 {
				t.Errorf("reload steps %d, reloaded blocks %d, GPU hits %d; want 1, 3, 0", reloadSteps, a2.reloadBlocks, a2.hitBlocks)
			}
			// The reload re-stores A's blocks on the GPU (vLLM caches loaded
			// blocks like computed ones) and publishes nothing for the CPU
			// copies already there.
			trace := offloadTrace(h)
			if i := slices.Index(trace, "BlockStored/GPU"); i < 0 || slices.Contains(trace, "BlockStored/CPU") {
				t.Errorf("events after the reload: %v; want a GPU BlockStored and no CPU one", trace)
			}
			var gpuStored []uint64
			for _, step := range h.events {
				for _, ev := range step {
					if ev.kind == eventStored && ev.medium == "" {
						gpuStored = append(gpuStored, ev.hashes...)
					}
				}
			}
			if !slices.Equal(gpuStored, aHashes) {
				t.Errorf("GPU BlockStored after reload %x, want A's %x", gpuStored, aHashes)
			}
			if h.st.cpu.readyBlocks() != 4+8 {
				t.Errorf("CPU tier holds %d ready blocks, want 12", h.st.cpu.readyBlocks())
			}
			_ = b
		})
	}
}

func testCPUTierSimple(t *testing.T) {
	e := startEngine(t, Config{BlockSize: 16, NumGPUBlocks: 9, NumCPUBlocks: 16, MaxModelLen: 256, KVEventsEndpoint: "none", ReplayEndpoint: "none"})
	base := e.URL()
	cached := func(prompt []uint32) int {
		res := post(t, base+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
		if res.status != 200 {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		s := string(res.body)
		i := strings.Index(s, `"cached_tokens":`)
		if i < 0 {
			t.Fatalf("no cached_tokens in %s", s)
		}
		n := 0
		for _, c := range s[i+len(`"cached_tokens":`):] {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	a := seqIDs(1, 64)
	if got := cached(a); got != 0 {
		t.Fatalf("first request cached %d", got)
	}
	cached(seqIDs(1000, 128)) // evicts A from the GPU
	if got := cached(a); got != 48 {
		t.Errorf("A again: cached_tokens %d, want 48 reloaded from the CPU tier", got)
	}
}

// TestCPUTierLRUEvictionEvents: storing past the tier's size evicts the least
// recently used ready blocks first, in one BlockRemoved/CPU published before
// the new blocks' BlockStored/CPU, as LRUOffloadingManager.prepare_store and
// complete_store do.
func TestCPUTierLRUEvictionEvents(t *testing.T) {
	h := newSchedHarness(t, Config{BlockSize: 16, NumGPUBlocks: 20, NumCPUBlocks: 4, MaxModelLen: 256})
	a := h.submit(seqIDs(1, 64), 1)
	h.runUntilIdle(100)
	b := h.submit(seqIDs(500, 48), 1)
	h.runUntilIdle(100)
	var got []string
	var removed, storedCPU [][]uint64
	for _, step := range h.events {
		for _, ev := range step {
			if ev.medium == MediumCPU {
				got = append(got, map[eventKind]string{eventStored: "stored", eventRemoved: "removed"}[ev.kind])
				if ev.kind == eventRemoved {
					removed = append(removed, ev.hashes)
				} else {
					storedCPU = append(storedCPU, ev.hashes)
				}
			}
		}
	}
	if want := []string{"stored", "removed", "stored"}; !slices.Equal(got, want) {
		t.Fatalf("CPU events %v, want %v", got, want)
	}
	if !slices.Equal(storedCPU[0], wireOf(a, 0, 4)) || !slices.Equal(storedCPU[1], wireOf(b, 0, 3)) {
		t.Errorf("CPU BlockStored %x", storedCPU)
	}
	// After each store the request's chain is touched last block first, so
	// A's tail is the least recently used and goes first; its first block
	// stays.
	if want := wireOf(a, 1, 4); !slices.Equal(removed[0], []uint64{want[2], want[1], want[0]}) {
		t.Errorf("CPU BlockRemoved %x, want A's tail %x, last block first", removed[0], want)
	}
}

// TestCPUTierWireEvents checks the encoded events against the fields
// OffloadingConnector.take_events sets: BlockStored with medium "CPU",
// block_size, parent nil, token_ids [], no LoRA and no group fields;
// BlockRemoved with the hashes and medium only.
func TestCPUTierWireEvents(t *testing.T) {
	evs := []poolEvent{
		{kind: eventRemoved, medium: MediumCPU, hashes: []uint64{7, 8}},
		{kind: eventStored, medium: MediumCPU, hashes: []uint64{9}},
	}
	for _, layout := range []kvevents.Layout{kvevents.LayoutMap, kvevents.LayoutArrayV0_25, kvevents.LayoutArrayV0_11} {
		payload, err := encodeBatch(evs, 16, 1.5, 0, layout, false)
		if err != nil {
			t.Fatal(err)
		}
		var b kvevents.Batch
		var dec kvevents.Decoder
		if err := dec.Decode(payload, &b); err != nil {
			t.Fatal(err)
		}
		rm, st := b.Events[0], b.Events[1]
		if rm.Type != kvevents.BlockRemoved || rm.Medium != "CPU" || !slices.Equal(rm.BlockHashes, []uint64{7, 8}) || rm.HasGroupIdx {
			t.Errorf("layout %d: BlockRemoved %+v", layout, rm)
		}
		if st.Type != kvevents.BlockStored || st.Medium != "CPU" || st.HasParent || len(st.TokenIDs) != 0 || st.BlockSize != 16 ||
			st.HasLoRAID || st.LoRAName != "" || st.HasGroupIdx || st.KVCacheSpecKind != "" || len(st.ExtraKeys) != 0 {
			t.Errorf("layout %d: BlockStored %+v", layout, st)
		}
	}
}

func TestCPUTierConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{NumCPUBlocks: -1}, "num-cpu-blocks -1"},
		{Config{NumCPUBlocks: 1 << 27}, "num-cpu-blocks"},
		{Config{NumCPUBlocks: 8, Engine: EngineSGLang}, "OffloadingConnector"},
		{Config{NumCPUBlocks: 8, CPUReloadUsPerToken: -1}, "cpu-reload-us-per-token"},
		{Config{NumCPUBlocks: 8, BlockSize: 32, HashBlockSize: 16}, "hash-block-size"},
	} {
		err := tc.cfg.withDefaults().validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
