package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// An idTable answers as a map[string][]uint32 would, a hash collision is a
// miss (never another string's ids), and a slice get returned keeps its
// values through later puts and resets (the caches hand it out under a read
// lock and callers copy it after).
func TestIDTableMatchesMap(t *testing.T) {
	tests := []struct {
		name      string
		hashes    uint64 // distinct hash values: small forces collisions
		textBlock int
		idsBlock  int
	}{
		{"no collisions, chunk blocks", 1 << 62, chunkTextBlock, chunkIDsBlock},
		{"many collisions, tiny blocks", 7, 16, 4},
		{"entries larger than a block", 1 << 62, 3, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(15, 16))
			tbl := newIDTable(tc.textBlock, tc.idsBlock)
			ref := map[string][]uint32{}
			hashOf := map[string]uint64{}
			type handed struct {
				got, want []uint32
			}
			var out []handed
			for step := range 3000 {
				s := fmt.Sprintf("w%d%s", r.IntN(300), strings.Repeat("x", r.IntN(40)))
				h, ok := hashOf[s]
				if !ok {
					h = r.Uint64N(tc.hashes)
					hashOf[s] = h
				}
				switch k := r.IntN(10); {
				case k < 5:
					got, ok := tbl.get(h, s)
					want, wok := ref[s]
					if ok && (!wok || !slices.Equal(got, want)) {
						t.Fatalf("step %d: get(%q) = %v, want %v (present %v)", step, s, got, want, wok)
					}
					if ok {
						out = append(out, handed{got, slices.Clone(got)})
					}
					if !ok && wok {
						// Only a colliding string put later may have replaced it.
						for o, oh := range hashOf {
							if oh == h && o != s {
								ok = true
							}
						}
						if !ok {
							t.Fatalf("step %d: %q missing without a collision", step, s)
						}
					}
				case k < 9:
					ids := make([]uint32, 1+r.IntN(12))
					for i := range ids {
						ids[i] = r.Uint32()
					}
					if _, had := ref[s]; had {
						ids = ref[s] // the caches put a string's ids only once
					}
					tbl.put(h, s, ids)
					ref[s] = slices.Clone(ids)
					for o, oh := range hashOf { // a colliding entry is replaced
						if oh == h && o != s {
							delete(ref, o)
						}
					}
				default:
					tbl.reset()
					clear(ref)
				}
				if tbl.entries != len(ref) {
					t.Fatalf("step %d: %d entries, want %d", step, tbl.entries, len(ref))
				}
			}
			for i, o := range out {
				if !slices.Equal(o.got, o.want) {
					t.Fatalf("slice %d handed out by get changed later", i)
				}
			}
		})
	}
}
