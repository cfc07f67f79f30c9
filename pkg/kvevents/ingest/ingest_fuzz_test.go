package ingest

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/kvgate/kvgate/pkg/inventory"
)

// FuzzIngest feeds arbitrary payloads to an Ingester: it must return an error
// or apply what decoded, never panic, and leave the inventory consistent
// (Blocks equals the snapshot's size). Seeds are the golden vLLM payloads.
//
//	go test -run '^$' -fuzz FuzzIngest -fuzztime 60s ./pkg/kvevents
func FuzzIngest(f *testing.F) {
	raw, err := os.ReadFile("../testdata/vllm_event_vectors.json")
	if err != nil {
		f.Fatal(err)
	}
	var v struct {
		Payloads []struct {
			PayloadHex string `json:"payload_hex"`
		} `json:"payloads"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		f.Fatal(err)
	}
	for _, p := range v.Payloads {
		b, err := hex.DecodeString(p.PayloadHex)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ix, err := inventory.New(inventory.Options{MaxBlocks: inventory.MinMaxBlocks})
	if err != nil {
		f.Fatal(err)
	}
	in := &Ingester{Inventory: ix, EPIdx: 1, Rank: 2}
	f.Fuzz(func(t *testing.T, payload []byte) {
		_, _ = in.Apply(payload)
		if got, snap := ix.Blocks(1), len(ix.Snapshot(1)); got != snap || got > inventory.MinMaxBlocks {
			t.Fatalf("Blocks = %d, snapshot %d, cap %d", got, snap, inventory.MinMaxBlocks)
		}
	})
}
