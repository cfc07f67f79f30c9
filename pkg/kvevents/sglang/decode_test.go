package sglang

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"testing"
)

// vectors mirrors testdata/sglang_event_vectors.json (gen_sglang_event_vectors.py).
type vectors struct {
	Cases []struct {
		Name   string `json:"name"`
		Hex    string `json:"hex"`
		Expect struct {
			Events []struct {
				Type      string   `json:"type"`
				Hashes    []int64  `json:"block_hashes"`
				Parent    *int64   `json:"parent_block_hash"`
				Tokens    []uint64 `json:"token_ids"`
				BlockSize int      `json:"block_size"`
				LoRAID    *int64   `json:"lora_id"`
				Medium    *string  `json:"medium"`
				CacheSalt *string  `json:"cache_salt"`
				SessionID *string  `json:"session_id"`
				LoRAName  *string  `json:"lora_name"`
			} `json:"events"`
			Rank          *int `json:"attn_dp_rank"`
			UnknownFields int  `json:"unknown_fields"`
			UnknownEvents int  `json:"unknown_events"`
			BadEvents     int  `json:"bad_events"`
		} `json:"expect"`
	} `json:"cases"`
}

func loadVectors(t testing.TB) *vectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/sglang_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no cases")
	}
	return &v
}

func s(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func TestDecodeVectors(t *testing.T) {
	for _, c := range loadVectors(t).Cases {
		t.Run(c.Name, func(t *testing.T) {
			raw, err := hex.DecodeString(c.Hex)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Decode(raw)
			if err != nil {
				t.Fatal(err)
			}
			x := c.Expect
			if b.HasRank != (x.Rank != nil) || (x.Rank != nil && b.AttnDPRank != *x.Rank) {
				t.Errorf("rank %d/%v, want %v", b.AttnDPRank, b.HasRank, x.Rank)
			}
			if b.UnknownFields != x.UnknownFields || b.UnknownEvents != x.UnknownEvents || b.BadEvents != x.BadEvents || b.UnknownMediums != 0 {
				t.Errorf("counts fields=%d events=%d bad=%d mediums=%d, want %d %d %d 0", b.UnknownFields, b.UnknownEvents, b.BadEvents, b.UnknownMediums, x.UnknownFields, x.UnknownEvents, x.BadEvents)
			}
			if len(b.Events) != len(x.Events) {
				t.Fatalf("%d events, want %d", len(b.Events), len(x.Events))
			}
			for i, e := range b.Events {
				w := x.Events[i]
				if e.Type.String() != w.Type {
					t.Errorf("event %d type %s, want %s", i, e.Type, w.Type)
				}
				if len(e.BlockHashes) != len(w.Hashes) {
					t.Fatalf("event %d: %d hashes, want %d", i, len(e.BlockHashes), len(w.Hashes))
				}
				for j, h := range e.BlockHashes {
					if int64(h) != w.Hashes[j] {
						t.Errorf("event %d hash %d = %d, want %d", i, j, int64(h), w.Hashes[j])
					}
				}
				if e.HasParent != (w.Parent != nil) || (w.Parent != nil && int64(e.ParentBlockHash) != *w.Parent) {
					t.Errorf("event %d parent %d/%v, want %v", i, int64(e.ParentBlockHash), e.HasParent, w.Parent)
				}
				if len(e.TokenIDs) != len(w.Tokens) || e.BlockSize != w.BlockSize {
					t.Errorf("event %d tokens %v bs %d, want %v %d", i, e.TokenIDs, e.BlockSize, w.Tokens, w.BlockSize)
				}
				if e.HasLoRAID != (w.LoRAID != nil) || e.Medium != s(w.Medium) || e.CacheSalt != s(w.CacheSalt) || e.SessionID != s(w.SessionID) || e.LoRAName != s(w.LoRAName) {
					t.Errorf("event %d = %+v, want %+v", i, e, w)
				}
				// A coalesced BlockStored chains page to page.
				if e.Type == BlockStored {
					parents, has := e.Parents()
					for j := 1; j < len(parents); j++ {
						if !has[j] || parents[j] != e.BlockHashes[j-1] {
							t.Errorf("event %d page %d parent %d", i, j, int64(parents[j]))
						}
					}
				}
			}
		})
	}
}

// TestDecodeErrors: malformed payloads are errors naming the problem, never
// panics or large allocations.
func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		hex     string
		tooBig  bool
		wantErr bool
	}{
		{"empty", "", false, true},
		{"not an array", "a3616263", false, true},
		{"batch of one", "91cb0000000000000000", false, true},
		{"ts not a number", "92a17890", false, true},
		{"events not an array", "92cb000000000000000001", false, true},
		{"huge array head", "92cb0000000000000000ddffffffff", false, true},
		{"events beyond MaxEvents", "92cb0000000000000000dd00010001", true, true},
		{"rank negative", "93cb000000000000000090ff", false, true},
		{"rank a string", "93cb000000000000000090a178", false, true},
		{"trailing bytes", "92cb000000000000000090c0", false, true},
		{"truncated event", "92cb00000000000000009196ab426c6f636b53746f726564", false, true},
		{"hashes beyond MaxHashesPerEvent", "92cb00000000000000009196ab426c6f636b53746f726564dd00010001", true, true},
		{"deep nesting", "92cb00000000000000009192a1789191919191919191919191919191919191919191919191919191919191919191919190", false, true},
		{"ok empty batch", "92cb000000000000000090", false, false},
		{"ok rank nil", "93cb000000000000000090c0", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := hex.DecodeString(tt.hex)
			if err != nil {
				t.Fatal(err)
			}
			if tt.tooBig {
				// Real elements behind the head, so the bound, not the
				// overrun check, is what refuses the payload.
				raw = append(raw, make([]byte, 1<<16+1)...)
			}
			_, err = Decode(raw)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if errors.Is(err, ErrTooLarge) != tt.tooBig {
				t.Errorf("err %v: ErrTooLarge %v, want %v", err, errors.Is(err, ErrTooLarge), tt.tooBig)
			}
		})
	}
	if _, err := Decode(make([]byte, MaxPayload+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized payload: %v", err)
	}
}

func TestKnownMedium(t *testing.T) {
	for m, want := range map[string]bool{"GPU": true, "CPU_PINNED": true, "DISK": true, "EXTERNAL": true, "CPU": false, "gpu": false, "": false} {
		if KnownMedium(m) != want {
			t.Errorf("KnownMedium(%q) = %v", m, !want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, c := range loadVectors(f).Cases {
		raw, _ := hex.DecodeString(c.Hex)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Decode(data)
		if err == nil {
			for _, e := range b.Events {
				if len(e.BlockHashes) > MaxHashesPerEvent || len(e.TokenIDs) > MaxTokensPerEvent {
					t.Fatalf("bounds exceeded: %d hashes %d tokens", len(e.BlockHashes), len(e.TokenIDs))
				}
			}
		}
	})
}
