package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// TestRecentCCC: cccOf gives every code point the canonical combining class
// the reference engine (node 20 / ICU 78.2, Unicode 17.0) uses, including
// the marks Unicode 16.0/17.0 added that x/text (Unicode 15.0) calls class 0.
// testdata/ccc_nonzero.json lists every non-zero class (gen_ccc_tables.mjs).
func TestRecentCCC(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "ccc_nonzero.json"))
	if err != nil {
		t.Fatal(err)
	}
	var classes [][2]float64
	if err := json.Unmarshal(raw, &classes); err != nil {
		t.Fatal(err)
	}
	if len(classes) < 900 {
		t.Fatalf("only %d classes", len(classes))
	}
	nonzero := make(map[rune]bool, len(classes))
	for _, c := range classes {
		r := rune(c[0])
		nonzero[r] = true
		if float64(cccOf(r)) != c[1] {
			t.Errorf("ccc(%U) = %d, want %v", r, cccOf(r), c[1])
		}
	}
	for r := range recentCCC {
		if !nonzero[r] {
			t.Errorf("recentCCC has %U, which the reference gives class 0", r)
		}
		if !isRecentMark(r) {
			t.Errorf("isRecentMark(%U) = false", r)
		}
		if !mayNeedRecentFix(string(r)) {
			t.Errorf("mayNeedRecentFix misses %U", r)
		}
	}
}

// TestRecentMarksNormalization: NFC, NFD and NFKC reorder and compose around
// the Unicode 16.0/17.0 marks exactly as the reference engine does
// (testdata/nfc_recent_marks.jsonl from gen_nfc_marks.mjs).
func TestRecentMarksNormalization(t *testing.T) {
	rows := readJSONLines[[4]string](t, filepath.Join("testdata", "nfc_recent_marks.jsonl"))
	reordered := 0
	for _, row := range rows {
		in := row[0]
		for i, form := range []norm.Form{norm.NFC, norm.NFD, norm.NFKC} {
			want := row[1+i]
			if got := (unicodeForm{form}).normalize(in); got != want {
				t.Errorf("form %d of %+q = %+q, want %+q", i, in, got, want)
			}
		}
		if norm.NFC.String(in) != row[1] {
			reordered++ // a case x/text alone gets wrong
		}
	}
	if reordered < 100 {
		t.Errorf("only %d inputs exercise the recent marks", reordered)
	}
}

// TestHasRecentMatchesRuneScan: the byte-skipping scan finds a recent
// character exactly when ranging over the string's runes does, for every
// rune alone and next to ASCII, two-byte runes and invalid bytes.
func TestHasRecentMatchesRuneScan(t *testing.T) {
	runeScan := func(s string) bool {
		for _, r := range s {
			if isRecentFirst(r) || isRecentMark(r) {
				return true
			}
			if _, ok := recentDecompositions[r]; ok {
				return true
			}
		}
		return false
	}
	contexts := []struct{ before, after string }{{"", ""}, {"ab", "cd"}, {"é", "\xc3"}, {"\xff\xc2", "\x80"}, {"\xe0\xa2", ""}}
	for r := rune(0); r <= 0x10FFFF; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		for _, c := range contexts {
			s := c.before + string(r) + c.after
			if got, want := hasRecent(s), runeScan(s); got != want {
				t.Fatalf("hasRecent(%q) = %v, ranging over runes gives %v", s, got, want)
			}
		}
	}
	for _, s := range []string{"\xe0\xa2\x97", "x\xe0\xa2", "\xf0\x90\x97\x89", "\xf0\x90\x97", "\xed\xa0\x80"} {
		if got, want := hasRecent(s), runeScan(s); got != want {
			t.Errorf("hasRecent(%q) = %v, ranging over runes gives %v", s, got, want)
		}
	}
}
