package segslice

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSliceMatchesPlain applies random prefixes and extensions to a Slice
// and to a plain slice and checks every read agrees, that no operation
// changes an earlier Slice, and that the segment count stays bounded.
func TestSliceMatchesPlain(t *testing.T) {
	cases := []struct {
		name   string
		steps  int
		maxExt int
	}{
		{"short tails", 300, 3},
		{"long tails", 200, 3000},
		{"past the segment bound", 2 * MaxSegments, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(c.steps)))
			var s Slice[uint32]
			var plain []uint32
			type snap struct {
				s    Slice[uint32]
				want []uint32
			}
			var history []snap
			for step := range c.steps {
				if len(plain) > 0 && r.IntN(3) == 0 {
					n := r.IntN(len(plain) + 1)
					s, plain = s.Prefix(n), slices.Clone(plain[:n])
				}
				tail := make([]uint32, r.IntN(c.maxExt)+1)
				for i := range tail {
					tail[i] = r.Uint32N(4)
				}
				s, plain = s.Extend(tail), append(slices.Clone(plain), tail...)
				tail[0] = 99 // the Slice must hold its own copy
				checkSame(t, step, s, plain, r)
				history = append(history, snap{s, plain})
				if len(s.segs) > MaxSegments {
					t.Fatalf("step %d: %d segments", step, len(s.segs))
				}
			}
			for i, h := range history {
				if got := h.s.AppendTo(nil, h.s.Len()); !slices.Equal(got, h.want) {
					t.Fatalf("snapshot %d changed", i)
				}
			}
		})
	}
}

func checkSame(t *testing.T, step int, s Slice[uint32], plain []uint32, r *rand.Rand) {
	t.Helper()
	if s.Len() != len(plain) || s.Held() < s.Len() {
		t.Fatalf("step %d: Len %d Held %d, want %d", step, s.Len(), s.Held(), len(plain))
	}
	if got := s.AppendTo([]uint32{5}, len(plain)); !slices.Equal(got[1:], plain) || got[0] != 5 {
		t.Fatalf("step %d: AppendTo differs", step)
	}
	n := r.IntN(len(plain) + 1)
	if got := s.AppendTo(nil, n); !slices.Equal(got, plain[:n]) {
		t.Fatalf("step %d: AppendTo(%d) differs", step, n)
	}
	lo := r.IntN(len(plain) + 1)
	hi := lo + r.IntN(len(plain)-lo+1)
	if got := s.Range(nil, lo, hi); !slices.Equal(got, plain[lo:hi]) {
		t.Fatalf("step %d: Range(%d, %d) differs", step, lo, hi)
	}
	other := slices.Clone(plain)
	if len(other) > 0 && r.IntN(2) == 0 {
		other = other[:r.IntN(len(other))]
	}
	if len(other) > 0 && r.IntN(2) == 0 {
		other[r.IntN(len(other))] = 77
	}
	other = append(other, 1, 2, 3)
	want := 0
	for want < min(len(plain), len(other)) && plain[want] == other[want] {
		want++
	}
	if got := s.CommonPrefix(other); got != want {
		t.Fatalf("step %d: CommonPrefix %d, want %d", step, got, want)
	}
}

// TestCommonPrefixSpans: the span-at-a-time comparison finds the first
// difference wherever it falls relative to the spans and the segments.
func TestCommonPrefixSpans(t *testing.T) {
	base := make([]uint32, 5000)
	for i := range base {
		base[i] = uint32(i * 7)
	}
	whole := Of(base)
	split := Of(base[:1500]).Extend(base[1500:1501]).ExtendOwned(slices.Clone(base[1501:]))
	for name, s := range map[string]Slice[uint32]{"one segment": whole, "three segments": split} {
		for _, at := range []int{0, 1, 15, 16, 1023, 1024, 1025, 1500, 1501, 2048, 4999} {
			other := slices.Clone(base)
			other[at]++
			if got := s.CommonPrefix(other); got != at {
				t.Errorf("%s, difference at %d: CommonPrefix = %d", name, at, got)
			}
		}
		for _, n := range []int{0, 1, 1024, 1500, 1501, 3000, 5000} {
			if got := s.CommonPrefix(base[:n]); got != n {
				t.Errorf("%s, prefix of %d: CommonPrefix = %d", name, n, got)
			}
		}
	}
}
