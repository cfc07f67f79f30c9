package tokenizer

import (
	"sort"
	"strings"
	"unicode/utf8"

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

// recentCCC holds the canonical combining classes of the marks Unicode 16.0
// and 17.0 added (x/text's Unicode 15.0 data gives them class 0, i.e. treats
// them as starters, so it neither reorders them nor composes across them).
// Measured on node 20 / ICU 78.2 by gen_ccc_tables.mjs; TestRecentCCC checks
// every non-zero class of that engine against cccOf.
var recentCCC = map[rune]uint8{
	0x0897: 230, 0x1ACF: 230, 0x1AD0: 230, 0x1AD1: 230, 0x1AD2: 230, 0x1AD3: 230,
	0x1AD4: 230, 0x1AD5: 230, 0x1AD6: 230, 0x1AD7: 230, 0x1AD8: 230, 0x1AD9: 230,
	0x1ADA: 230, 0x1ADB: 230, 0x1ADC: 230, 0x1ADD: 220, 0x1AE0: 230, 0x1AE1: 230,
	0x1AE2: 230, 0x1AE3: 230, 0x1AE4: 230, 0x1AE5: 230, 0x1AE6: 220, 0x1AE7: 230,
	0x1AE8: 230, 0x1AE9: 230, 0x1AEA: 230, 0x1AEB: 234, 0x10D69: 230, 0x10D6A: 230,
	0x10D6B: 230, 0x10D6C: 230, 0x10D6D: 230, 0x10EFA: 220, 0x10EFB: 220, 0x113CE: 9,
	0x113CF: 9, 0x113D0: 9, 0x1612F: 9, 0x1E5EE: 230, 0x1E5EF: 220, 0x1E6E3: 230,
	0x1E6E6: 230, 0x1E6EE: 230, 0x1E6EF: 230, 0x1E6F5: 230,
}

// isRecentMark reports whether r is in recentCCC.
func isRecentMark(r rune) bool {
	switch {
	case r == 0x0897, r >= 0x1ACF && r <= 0x1AEB, r >= 0x10D69 && r <= 0x10EFB,
		r >= 0x113CE && r <= 0x1612F, r >= 0x1E5EE && r <= 0x1E6F5:
		_, ok := recentCCC[r]
		return ok
	}
	return false
}

// cccOf is r's canonical combining class in Unicode 17.0.
func cccOf(r rune) int {
	if c, ok := recentCCC[r]; ok {
		return int(c)
	}
	return int(norm.NFD.PropertiesString(string(r)).CCC())
}

// mayNeedRecentFix is a cheap byte-level prefilter: every rune fixRecent
// handles is a 4-byte sequence (F0 ...), U+0897 (E0 A2 97) or in
// U+1AC0..U+1AFF (E1 AB xx).
func mayNeedRecentFix(s string) bool {
	return strings.IndexByte(s, 0xF0) >= 0 || strings.Contains(s, "\xe1\xab") || strings.Contains(s, "\xe0\xa2\x97")
}

// composeRecent fixes x/text's NFC or NFKC output s for Unicode 16.0/17.0:
// the new canonical compositions (recentCompositions) and the combining
// classes of the new marks (recentCCC).
func composeRecent(s string) string { return fixRecent(s, true) }

// decomposeRecent fixes x/text's NFD or NFKD output s the same way: it
// decomposes the new composites and puts the new marks in canonical order.
func decomposeRecent(s string) string { return fixRecent(s, false) }

// fixRecent redoes the canonical algorithm (full canonical decomposition,
// canonical ordering by Unicode 17.0 classes, then, if compose, canonical
// composition) on strings holding a character x/text's Unicode 15.0 data
// gets wrong. Other strings are returned unchanged.
func fixRecent(s string, compose bool) string {
	if !mayNeedRecentFix(s) {
		return s
	}
	if !hasRecent(s) {
		return s
	}
	// s is already normalized by x/text, so its NFD is the full canonical
	// decomposition except for the composites x/text does not know.
	dec := make([]rune, 0, len(s)+8)
	for _, r := range norm.NFD.String(s) {
		dec = appendDecomposed(dec, r)
	}
	canonicalOrder(dec)
	out := dec
	if compose {
		out = canonicalCompose(dec)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range out {
		b.WriteRune(r)
	}
	return b.String()
}

// canonicalOrder sorts each run of non-starters of dec by combining class,
// stably, in place.
func canonicalOrder(dec []rune) {
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
}

// canonicalCompose is the canonical composition of the ordered
// decomposition dec: each mark not blocked from the last starter composes
// with it when a primary composite exists.
func canonicalCompose(dec []rune) []rune {
	out := make([]rune, 0, len(dec))
	starter, lastCCC := -1, -1 // lastCCC -1: nothing since the starter
	for _, c := range dec {
		ccc := cccOf(c)
		if starter >= 0 && (lastCCC == -1 || (lastCCC != 0 && lastCCC < ccc)) {
			if comp, ok := composePair(out[starter], c); ok {
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
	return out
}

// composePair returns the primary composite of starter l and c: a Unicode
// 16.0 pair, or one x/text composes (the NFC of the pair is one rune).
func composePair(l, c rune) (rune, bool) {
	if comp, ok := recentCompositions[[2]rune{l, c}]; ok {
		return comp, true
	}
	if isRecentMark(c) {
		return 0, false // no composition has a Unicode 16/17 mark second but those above
	}
	var buf [2 * utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], l)
	n += utf8.EncodeRune(buf[n:], c)
	pair := string(buf[:n])
	nfc := norm.NFC.String(pair)
	if r, size := utf8.DecodeRuneInString(nfc); size == len(nfc) && nfc != pair {
		return r, true
	}
	return 0, false
}

var recentDecompositions = func() map[rune][2]rune {
	m := make(map[rune][2]rune, len(recentCompositions))
	for pair, c := range recentCompositions {
		m[c] = pair
	}
	return m
}()

func isRecentComposite(r rune) bool {
	if r < 0x105C9 || r > 0x16D6A { // the range of recentCompositions' values
		return false
	}
	_, ok := recentDecompositions[r]
	return ok
}

// hasRecent reports whether s holds a character fixRecent must redo. Every
// such character is at U+0897 or above, so bytes below 0xE0 (ASCII, the
// leads of runes below U+0800 and continuation bytes) are skipped without
// decoding; a byte from 0xE0 on always starts a rune, so decoding from it
// reads s as ranging over it would.
func hasRecent(s string) bool {
	for i := 0; i < len(s); {
		if s[i] < 0xE0 {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		if isRecentFirst(r) || isRecentComposite(r) || isRecentMark(r) {
			return true
		}
	}
	return false
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
