package ingest

import (
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// sglangVectors are the payloads SGLang's own recorder produced (see
// pkg/kvevents/sglang/testdata and docs/engines.md, "Golden vectors"), with
// the events SGLang decodes from them.
type sglangVectors struct {
	Cases []struct {
		Name   string `json:"name"`
		Hex    string `json:"hex"`
		Expect struct {
			Events []struct {
				Type        string  `json:"type"`
				BlockHashes []int64 `json:"block_hashes"`
				Medium      *string `json:"medium"`
			} `json:"events"`
		} `json:"expect"`
	} `json:"cases"`
}

// TestSGLangAdapterVectors applies each golden SGLang payload through the
// SGLang adapter and checks the inventory against a model built from the
// engine's own decoding: GPU (or nil-medium) pages score, other media are
// kept apart, AllBlocksCleared clears the rank.
func TestSGLangAdapterVectors(t *testing.T) {
	raw, err := os.ReadFile("../sglang/testdata/sglang_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs sglangVectors
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs.Cases) < 8 {
		t.Fatalf("%d vector cases, want the committed set", len(vs.Cases))
	}
	for _, c := range vs.Cases {
		t.Run(c.Name, func(t *testing.T) {
			payload, err := hex.DecodeString(c.Hex)
			if err != nil {
				t.Fatal(err)
			}
			// The model: per medium, the set of 64-bit patterns.
			want := map[string]map[uint64]bool{}
			for _, e := range c.Expect.Events {
				m := inventory.MediumGPU
				if e.Medium != nil && *e.Medium != "GPU" {
					m = *e.Medium
				}
				if want[m] == nil {
					want[m] = map[uint64]bool{}
				}
				for _, h := range e.BlockHashes {
					switch e.Type {
					case "BlockStored":
						want[m][uint64(h)] = true
					case "BlockRemoved":
						delete(want[m], uint64(h))
					}
				}
				if e.Type == "AllBlocksCleared" {
					want = map[string]map[uint64]bool{}
				}
			}
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			in := &Ingester{Inventory: ix, EPIdx: 3, Rank: 1, Engine: EngineSGLang}
			if _, err := in.Apply(payload); err != nil {
				t.Fatalf("apply: %v", err)
			}
			var wantGPU []uint64
			for h := range want[inventory.MediumGPU] {
				wantGPU = append(wantGPU, h)
			}
			slices.Sort(wantGPU)
			got := ix.Snapshot(3)
			slices.Sort(got)
			if !slices.Equal(got, wantGPU) {
				t.Errorf("GPU inventory %x, want %x", got, wantGPU)
			}
			other := ix.MediumBlocks(3)
			for m, set := range want {
				if m != inventory.MediumGPU && len(set) > 0 && other[m] != len(set) {
					t.Errorf("medium %s holds %d blocks, want %d (all media: %v)", m, other[m], len(set), other)
				}
			}
		})
	}
}

// TestParseEngine maps kvEngineType to the ingest adapters; llama.cpp has
// none (it publishes no KV events).
func TestParseEngine(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Engine
		ok   bool
	}{
		{"", EngineVLLM, true},
		{"vllm", EngineVLLM, true},
		{"sglang", EngineSGLang, true},
		{"trtllm", EngineTRTLLM, true},
		{"llamacpp", 0, false},
	} {
		got, err := ParseEngine(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseEngine(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestExactGranularity: an SGLang page of 2 × kvBlockSize tokens is
// unmatchable (one hash per page), where vLLM's would score every 2nd hash.
func TestExactGranularity(t *testing.T) {
	for _, tc := range []struct {
		name      string
		g         *Granularity
		blockSize int
		ok        bool
	}{
		{"vllm multiple", NewGranularity(16), 32, true},
		{"vllm equal", NewGranularity(16), 16, true},
		{"exact equal", NewExactGranularity(16), 16, true},
		{"exact multiple", NewExactGranularity(16), 32, false},
		{"exact smaller", NewExactGranularity(16), 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ok, _ := tc.g.observe(0, tc.blockSize)
			if ok != tc.ok {
				t.Fatalf("observe(%d) ok = %v, want %v", tc.blockSize, ok, tc.ok)
			}
			if _, bad := tc.g.Unusable(); bad == tc.ok {
				t.Fatalf("Unusable = %v, want %v", bad, !tc.ok)
			}
		})
	}
}

// TestSGLangServerInfoPageSize: an SGLang target reads page_size from
// GET /get_server_info on its HTTP port, so a kvBlockSize that differs is
// unusable before any event arrives (the PUB port here has no publisher).
func TestSGLangServerInfoPageSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string // "" answers 404
		bad  bool
	}{
		{"page size 32 behind kvBlockSize 16", `{"page_size":32,"dp_size":1}`, true},
		{"equal page size", `{"page_size":16}`, false},
		{"no /get_server_info", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			served := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				served++
				mu.Unlock()
				if tc.body == "" || r.URL.Path != "/get_server_info" {
					http.NotFound(w, r)
					return
				}
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			host, p, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
			port, _ := strconv.Atoi(p)
			ix, _ := inventory.New(inventory.Options{})
			g := NewExactGranularity(16)
			m := NewManager(testOptions(newRecorder()))
			defer m.Close()
			closed := freePort(t, host)
			if err := m.Reconcile([]Target{{Service: 1, IP: host, Port: closed, Ranks: 1, Engine: EngineSGLang, HTTPPort: port,
				Inventory: ix, Granularity: g}}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				n := served
				mu.Unlock()
				if _, bad := g.Unusable(); bad == tc.bad && n > 0 {
					break
				}
				if time.Now().After(deadline) {
					_, bad := g.Unusable()
					t.Fatalf("Unusable() = %v after %d reads, want %v", bad, n, tc.bad)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
