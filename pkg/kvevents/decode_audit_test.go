package kvevents

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
)

// auditEvent is the decoded form testdata/gen_audit_events.py writes (the
// shape kvctl events decode prints), computed with python3-msgpack.
type auditEvent struct {
	Type            string   `json:"type"`
	BlockHashes     []uint64 `json:"block_hashes"`
	ParentBlockHash *uint64  `json:"parent_block_hash"`
	TokenIDs        []uint32 `json:"token_ids"`
	BlockSize       *int     `json:"block_size"`
	Medium          *string  `json:"medium"`
	LoRAName        *string  `json:"lora_name"`
}

type auditBatch struct {
	TS     float64      `json:"ts"`
	Rank   *int         `json:"data_parallel_rank"`
	Events []auditEvent `json:"events"`
}

func auditView(b *Batch) auditBatch {
	out := auditBatch{TS: b.TS, Events: []auditEvent{}}
	if b.HasRank {
		r := b.DataParallelRank
		out.Rank = &r
	}
	for i := range b.Events {
		e := &b.Events[i]
		ae := auditEvent{Type: e.Type.String(), BlockHashes: append([]uint64{}, e.BlockHashes...), TokenIDs: append([]uint32{}, e.TokenIDs...)}
		if e.HasParent {
			p := e.ParentBlockHash
			ae.ParentBlockHash = &p
		}
		if e.Type == BlockStored && e.HasBlockSize {
			bs := e.BlockSize
			ae.BlockSize = &bs
		}
		if e.HasMedium {
			m := e.Medium
			ae.Medium = &m
		}
		if e.HasLoRAName {
			l := e.LoRAName
			ae.LoRAName = &l
		}
		out.Events = append(out.Events, ae)
	}
	return out
}

// TestAuditPayloads decodes payloads written with random legal msgpack
// widths (independent writer in gen_audit_events.py) and compares with
// python3-msgpack's decode: an empty-string medium or lora_name stays "",
// a nil or out-of-range block_size is absent, an out-of-range token id
// drops token_ids, and a malformed data_parallel_rank is dropped without
// losing the batch's events.
func TestAuditPayloads(t *testing.T) {
	raw, err := os.ReadFile("testdata/audit_events.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []struct {
			Name       string          `json:"name"`
			PayloadHex string          `json:"payload_hex"`
			Expect     json.RawMessage `json:"expect"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) < 100 {
		t.Fatalf("only %d cases", len(file.Cases))
	}
	var d Decoder
	var b Batch
	for _, c := range file.Cases {
		t.Run(c.Name, func(t *testing.T) {
			payload, err := hex.DecodeString(c.PayloadHex)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(payload, &b); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var want auditBatch
			if err := json.Unmarshal(c.Expect, &want); err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(auditView(&b))
			wantJSON, _ := json.Marshal(want)
			if !bytes.Equal(got, wantJSON) {
				t.Errorf("decoded\n got %s\nwant %s", got, wantJSON)
			}
		})
	}
}

// TestEmptyStringsRoundTrip: a present "" medium / lora_name is encoded
// back as "", not nil, so re-encoding a decoded batch keeps it.
func TestEmptyStringsRoundTrip(t *testing.T) {
	for _, layout := range []Layout{LayoutMap, LayoutArrayV0_25, LayoutArrayV0_15} {
		in := Batch{TS: 1, HasRank: true, Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{1}, BlockSize: 16, HasBlockSize: true, HasMedium: true, HasLoRAName: true},
			{Type: BlockStored, BlockHashes: []uint64{2}, BlockSize: 16, HasBlockSize: true},
		}}
		payload, err := AppendEncode(nil, &in, layout)
		if err != nil {
			t.Fatal(err)
		}
		var d Decoder
		var out Batch
		if err := d.Decode(payload, &out); err != nil {
			t.Fatal(err)
		}
		if e := out.Events[0]; !e.HasMedium || !e.HasLoRAName || e.Medium != "" || e.LoRAName != "" {
			t.Errorf("%v: present empty strings lost: %+v", layout, e)
		}
		if e := out.Events[1]; e.HasMedium || e.HasLoRAName {
			t.Errorf("%v: absent strings became present: %+v", layout, e)
		}
	}
}
