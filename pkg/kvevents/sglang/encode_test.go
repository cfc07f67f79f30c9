package sglang

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// TestEncodeVectors re-encodes every golden payload the encoder's shapes
// cover (the array shape with medium, the map shape) from its decoded events
// and requires SGLang's bytes exactly.
func TestEncodeVectors(t *testing.T) {
	v := loadVectors(t)
	covered := map[string]bool{
		"legacy_array_medium_GPU_rank_None":     true,
		"legacy_array_medium_CPU_PINNED_rank_3": true,
		"legacy_array_medium_DISK_rank_0":       true,
		"legacy_array_medium_EXTERNAL_rank_1":   true,
		"legacy_array_medium_nil":               true,
		"map_coalesced_salt_session_lora":       true,
	}
	n := 0
	for _, c := range v.Cases {
		if !covered[c.Name] {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			want, err := hex.DecodeString(c.Hex)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Decode(want)
			if err != nil {
				t.Fatal(err)
			}
			shape := ShapeArray
			if len(b.Events) > 0 {
				shape = b.Events[0].Shape
			}
			got, err := AppendEncode(nil, b, shape)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoded\n%x\nwant SGLang's\n%x", got, want)
			}
		})
	}
	if n != len(covered) {
		t.Fatalf("%d covered vectors found, want %d", n, len(covered))
	}
}

func TestEncodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b     Batch
		shape Shape
	}{
		{"unknown shape", Batch{}, 0},
		{"unknown event", Batch{Events: []Event{{Type: Unknown}}}, ShapeMap},
		{"salt in array shape", Batch{Events: []Event{{Type: BlockStored, CacheSalt: "x"}}}, ShapeArray},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := AppendEncode(nil, &tc.b, tc.shape); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}
