package kvhash

import "testing"

// TestCommonTokens: the span-at-a-time comparison finds the first
// difference wherever it falls relative to the spans.
func TestCommonTokens(t *testing.T) {
	base := make([]uint32, 5000)
	for i := range base {
		base[i] = uint32(i * 7)
	}
	for _, at := range []int{0, 1, 15, 16, 1023, 1024, 1025, 2048, 4999} {
		other := append([]uint32(nil), base...)
		other[at]++
		if got := commonTokens(base, other); got != at {
			t.Errorf("difference at %d: commonTokens = %d", at, got)
		}
	}
	for _, n := range []int{0, 1, 1024, 3000, 5000} {
		if got := commonTokens(base, base[:n]); got != n {
			t.Errorf("prefix of %d tokens: commonTokens = %d", n, got)
		}
	}
}
