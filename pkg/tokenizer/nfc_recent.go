package tokenizer

import (
	"sort"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// golang.org/x/text's normalization data is Unicode 15.0. Unicode 16.0 added
// canonical compositions for four new scripts; the reference engine (Unicode
// 17.0) applies them, so NFC and NFKC here apply them too, after x/text.
// Source: String.prototype.normalize in node 20 / ICU 78.2 (see
// bench/tokenizer/gen_nfc_expectations.mjs and TestRecentCompositions).
var recentCompositions = map[[2]rune]rune{
	{0x105D2, 0x0307}: 0x105C9, {0x105DA, 0x0307}: 0x105E4, // Todhri
	{0x11382, 0x113C9}: 0x11383, {0x11384, 0x113BB}: 0x11385, {0x1138B, 0x113C2}: 0x1138E, // Tulu-Tigalari
	{0x11390, 0x113C9}: 0x11391, {0x113C2, 0x113C2}: 0x113C5, {0x113C2, 0x113B8}: 0x113C7,
	{0x113C2, 0x113C9}: 0x113C8,
	{0x1611E, 0x1611E}: 0x16121, {0x1611E, 0x16129}: 0x16122, {0x1611E, 0x1611F}: 0x16123, // Gurung Khema
	{0x16129, 0x1611F}: 0x16124, {0x1611E, 0x16120}: 0x16125, {0x16121, 0x1611F}: 0x16126,
	{0x16122, 0x1611F}: 0x16127, {0x16121, 0x16120}: 0x16128,
	{0x16D67, 0x16D67}: 0x16D68, {0x16D63, 0x16D67}: 0x16D69, {0x16D69, 0x16D67}: 0x16D6A, // Kirat Rai
}

// composeRecent applies recentCompositions with the canonical composition
// algorithm (a mark composes with the last starter unless blocked by a
// character of class 0 or of a class not lower than its own).
func composeRecent(s string) string {
	// All first elements are 4-byte sequences starting F0 90 / F0 91 / F0 96.
	if strings.IndexByte(s, 0xF0) < 0 {
		return s
	}
	has := false
	for _, r := range s {
		if isRecentFirst(r) || isRecentComposite(r) {
			has = true
			break
		}
	}
	if !has {
		return s
	}
	// Decompose the new composites (full canonical decomposition), then put
	// marks back in canonical order, then compose.
	dec := make([]rune, 0, len(s)+8)
	for _, r := range s {
		dec = appendDecomposed(dec, r)
	}
	cccOf := func(r rune) int { return int(norm.NFC.PropertiesString(string(r)).CCC()) }
	for i := 0; i < len(dec); {
		if cccOf(dec[i]) == 0 {
			i++
			continue
		}
		j := i
		for j < len(dec) && cccOf(dec[j]) != 0 {
			j++
		}
		run := dec[i:j]
		sort.SliceStable(run, func(a, b int) bool { return cccOf(run[a]) < cccOf(run[b]) })
		i = j
	}
	out := make([]rune, 0, len(dec))
	starter, lastCCC := -1, -1 // lastCCC -1: nothing since the starter
	for _, c := range dec {
		ccc := cccOf(c)
		if starter >= 0 && (lastCCC == -1 || (lastCCC != 0 && lastCCC < ccc)) {
			if comp, ok := recentCompositions[[2]rune{out[starter], c}]; ok {
				out[starter] = comp
				continue
			}
		}
		out = append(out, c)
		if ccc == 0 {
			starter, lastCCC = len(out)-1, -1
		} else {
			lastCCC = ccc
		}
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range out {
		b.WriteRune(r)
	}
	return b.String()
}

var recentDecompositions = func() map[rune][2]rune {
	m := make(map[rune][2]rune, len(recentCompositions))
	for pair, c := range recentCompositions {
		m[c] = pair
	}
	return m
}()

func isRecentComposite(r rune) bool {
	_, ok := recentDecompositions[r]
	return ok
}

func appendDecomposed(dst []rune, r rune) []rune {
	if pair, ok := recentDecompositions[r]; ok {
		dst = appendDecomposed(dst, pair[0])
		return append(dst, pair[1])
	}
	return append(dst, r)
}

func isRecentFirst(r rune) bool {
	switch {
	case r >= 0x105D2 && r <= 0x105DA, r >= 0x11382 && r <= 0x113C2, r >= 0x1611E && r <= 0x16129, r >= 0x16D63 && r <= 0x16D69:
		return true
	}
	return false
}
