package tokenizer

import (
	"strings"
	"testing"
)

// TestCommonPrefixSteps: the stepped comparison finds the first difference
// wherever it falls relative to the 4 KiB and 64-byte steps.
func TestCommonPrefixSteps(t *testing.T) {
	var sb strings.Builder
	for i := 0; sb.Len() < 10000; i++ {
		sb.WriteByte(byte('a' + i%23))
	}
	base := sb.String()
	for _, at := range []int{0, 1, 63, 64, 65, 4095, 4096, 4097, 4160, 8191, 8192, 9999} {
		other := []byte(base)
		other[at]++
		if got := commonPrefix(base, string(other)); got != at {
			t.Errorf("difference at %d: commonPrefix = %d", at, got)
		}
	}
	for _, n := range []int{0, 1, 64, 4096, 4100, 8192, 10000} {
		if got := commonPrefix(base, base[:n]); got != n {
			t.Errorf("prefix of %d bytes: commonPrefix = %d", n, got)
		}
		if got := commonPrefix(base[:n], base); got != n {
			t.Errorf("prefix of %d bytes, swapped: commonPrefix = %d", n, got)
		}
	}
}
