package inventory

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
)

// FuzzIndexOps interprets the input as a program of adds, removes and clears
// over a small key space and checks the index against the model.
//
//	go test -run '^$' -fuzz FuzzIndexOps -fuzztime 60s ./pkg/inventory
func FuzzIndexOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x00, 0x10, 0x41, 0x10, 0x80, 0x00, 0xc1, 0x22})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 4096 {
			prog = prog[:4096]
		}
		ix, err := New(Options{MaxBlocks: MaxMaxBlocks})
		if err != nil {
			t.Fatal(err)
		}
		m := model{}
		for i := 0; i+1 < len(prog); i += 2 {
			op, arg := prog[i], prog[i+1]
			ep, rank := int(op>>2&7), int(op>>5&1)
			mb := makeMember(ep, rank)
			h := uint64(arg)
			if op&0x40 != 0 {
				h |= 1 << 63 // some hashes above 2^63
			}
			switch op & 3 {
			case 0, 1:
				if err := ix.Add(ep, rank, "", []uint64{h, h + 1}); err != nil {
					t.Fatal(err)
				}
				for _, x := range []uint64{h, h + 1} {
					if m[x] == nil {
						m[x] = map[member]bool{}
					}
					m[x][mb] = true
				}
			case 2:
				if err := ix.Remove(ep, rank, "GPU", []uint64{h}); err != nil {
					t.Fatal(err)
				}
				delete(m[h], mb)
				if len(m[h]) == 0 {
					delete(m, h)
				}
			case 3:
				if arg&1 == 0 {
					if err := ix.ClearRank(ep, rank); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := ix.ClearEndpoint(ep); err != nil {
						t.Fatal(err)
					}
				}
				for x, ms := range m {
					for y := range ms {
						if y == mb || (arg&1 == 1 && y.ep() == ep) {
							delete(ms, y)
						}
					}
					if len(ms) == 0 {
						delete(m, x)
					}
				}
			}
		}
		for ep := range 8 {
			want := m.endpoint(ep)
			if got := ix.Snapshot(ep); !slices.Equal(got, want) {
				t.Fatalf("endpoint %d: %v, want %v", ep, got, want)
			}
			if ix.Blocks(ep) != len(want) {
				t.Fatalf("Blocks(%d) = %d, want %d", ep, ix.Blocks(ep), len(want))
			}
		}
		prompt := []uint64{0, 1, 2, 3, 1 << 63, 1<<63 + 1}
		for _, run := range []bool{true, false} {
			var got [epset.Max]uint32
			ix.Score(prompt, epset.FirstN(8), run, &got)
			if want := m.score(prompt, epset.FirstN(8), run); got != want {
				t.Fatalf("Score(run=%v) differs", run)
			}
		}
	})
}
