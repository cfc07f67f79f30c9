package trtllm

import (
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
)

// vectors mirrors testdata/trtllm_event_vectors.json (gen_trtllm_event_vectors.py).
type vectors struct {
	Provenance struct {
		Hashes map[string][]string `json:"hashes_by_name"`
	} `json:"provenance"`
	Cases []struct {
		Name string `json:"name"`
		Body string `json:"body"`
	} `json:"cases"`
}

func loadVectors(t testing.TB) (*vectors, map[string][]uint64) {
	t.Helper()
	raw, err := os.ReadFile("testdata/trtllm_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	hs := map[string][]uint64{}
	for k, list := range v.Provenance.Hashes {
		for _, s := range list {
			u, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			hs[k] = append(hs[k], u)
		}
	}
	return &v, hs
}

func TestDecodeVectors(t *testing.T) {
	v, hs := loadVectors(t)
	h, h2, part, lora, salt := hs["h"], hs["h2"], hs["partial"], hs["lora7"], hs["salt"]
	tests := []struct {
		name   string
		types  string // event data types in order
		ranks  string
		has    []uint64
		hasNot []uint64
		len    int
		parts  int
	}{
		{"created_stored_removed_updated", "created,stored,stored,updated,removed", "0,0,0,0,0", []uint64{h[0], h2[1]}, []uint64{h[1], h[2]}, 2, 0},
		{"attention_dp_ranks", "stored,stored,removed", "0,1,0", []uint64{h[0]}, []uint64{h[1]}, 1, 0},
		{"partial_block_lora_salt", "stored,stored,stored", "0,0,0", []uint64{part[0], part[1], lora[0], lora[1], salt[0]}, []uint64{part[2]}, 5, 1},
		{"empty_drain", "", "", nil, nil, 0, 0},
	}
	bodies := map[string]string{}
	for _, c := range v.Cases {
		bodies[c.Name] = c.Body
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, err := Decode([]byte(bodies[tt.name]))
			if err != nil {
				t.Fatal(err)
			}
			var types, ranks []string
			u := &Union{TokensPerBlock: 32}
			for i := range evs {
				types = append(types, string(evs[i].Data.Type))
				ranks = append(ranks, strconv.Itoa(evs[i].Rank()))
				u.Apply(&evs[i])
			}
			if strings.Join(types, ",") != tt.types || strings.Join(ranks, ",") != tt.ranks {
				t.Errorf("types %v ranks %v, want %s / %s", types, ranks, tt.types, tt.ranks)
			}
			for _, x := range tt.has {
				if !u.Has(x) {
					t.Errorf("union lacks %d", x)
				}
			}
			for _, x := range tt.hasNot {
				if u.Has(x) {
					t.Errorf("union holds %d", x)
				}
			}
			if u.Len() != tt.len || u.Partial != tt.parts {
				t.Errorf("len %d partial %d, want %d %d", u.Len(), u.Partial, tt.len, tt.parts)
			}
		})
	}
	// Fields of the first body, exactly.
	evs, _ := Decode([]byte(bodies["created_stored_removed_updated"]))
	st := evs[2].Data
	if st.ParentHash == nil || *st.ParentHash != h[0] || len(st.Blocks) != 1 || st.Blocks[0].BlockHash != h2[1] || len(st.Blocks[0].Tokens) != 32 || st.Blocks[0].Tokens[0].TokenID != 500 || st.Blocks[0].Priority != 35 {
		t.Errorf("stored event %+v", st)
	}
	if evs[1].Data.ParentHash != nil || evs[0].Data.NumBlocksPerCacheLevel[1] != 4096 || evs[3].Data.CacheLevel.New != 1 || evs[0].WindowSize != 4096 {
		t.Errorf("events %+v", evs)
	}
}

func TestUnionCreatedResetsRank(t *testing.T) {
	r1 := 1
	u := &Union{}
	blk := func(h uint64) Block { return Block{BlockHash: h} }
	u.Apply(&Event{Data: Data{Type: Stored, Blocks: []Block{blk(1), blk(2)}}})
	u.Apply(&Event{AttentionDPRank: &r1, Data: Data{Type: Stored, Blocks: []Block{blk(2)}}})
	u.Apply(&Event{Data: Data{Type: Created}})
	if u.Has(1) || !u.Has(2) || u.Len() != 1 {
		t.Errorf("after rank 0 re-created: has1 %v has2 %v len %d", u.Has(1), u.Has(2), u.Len())
	}
	capped := &Union{MaxBlocks: 1}
	capped.Apply(&Event{Data: Data{Type: Stored, Blocks: []Block{blk(1), blk(2)}}})
	if capped.Len() != 1 || capped.Dropped != 1 {
		t.Errorf("capped len %d dropped %d", capped.Len(), capped.Dropped)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		want   string
		tooBig bool
	}{
		{"empty", ``, "not a drain body", false},
		{"null", `null`, "null", false},
		{"object", `{"event_id":1}`, "not a drain body", false},
		{"trailing", `[] []`, "trailing", false},
		{"unknown type", `[{"event_id":1,"data":{"type":"moved"}}]`, `"moved"`, false},
		{"no type", `[{"event_id":1,"data":{}}]`, `no "type"`, false},
		{"negative hash", `[{"event_id":1,"data":{"type":"removed","block_hashes":[-1]}}]`, "not a drain body", false},
		{"fractional hash", `[{"event_id":1,"data":{"type":"removed","block_hashes":[1.5]}}]`, "not a drain body", false},
		{"hash above uint64", `[{"event_id":1,"data":{"type":"removed","block_hashes":[18446744073709551616]}}]`, "not a drain body", false},
		{"negative rank", `[{"event_id":1,"attention_dp_rank":-1,"data":{"type":"created"}}]`, "attention_dp_rank", false},
		{"too many hashes", `[{"event_id":1,"data":{"type":"removed","block_hashes":[` + strings.Repeat("1,", MaxBlocksPerEvent) + `1]}}]`, "beyond bounds", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %s", err, tt.want)
			}
			if errors.Is(err, ErrTooLarge) != tt.tooBig {
				t.Errorf("ErrTooLarge = %v", !tt.tooBig)
			}
		})
	}
	if _, err := Decode(make([]byte, MaxBody+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized body: %v", err)
	}
	// Unknown keys are ignored.
	evs, err := Decode([]byte(`[{"event_id":7,"new_key":{"a":[1]},"window_size":32,"data":{"type":"removed","block_hashes":[18446744073709551615],"extra":1}}]`))
	if err != nil || len(evs) != 1 || evs[0].Data.BlockHashes[0] != 1<<64-1 {
		t.Errorf("unknown keys: %v %+v", err, evs)
	}
}

func FuzzDecode(f *testing.F) {
	v, _ := loadVectors(f)
	for _, c := range v.Cases {
		f.Add([]byte(c.Body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		evs, err := Decode(body)
		if err != nil {
			return
		}
		u := &Union{TokensPerBlock: 32, MaxBlocks: 1024}
		for i := range evs {
			u.Apply(&evs[i])
		}
		if u.Len() > 1024 {
			t.Fatalf("union beyond MaxBlocks: %d", u.Len())
		}
	})
}
