package tokenizer

import (
	"path/filepath"
	"slices"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// comparableWithGo reports whether regexp2 can serve as the oracle for s:
// no rune may case-fold to an ASCII letter (regexp2 folds with Unicode rules,
// the reference with ASCII only). Characters Go's tables do not know are
// fine: regexMatcher stands in known characters of the same category.
func comparableWithGo(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError {
			return false
		}
		if r >= utf8.RuneSelf {
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				if f < utf8.RuneSelf {
					return false
				}
			}
		}
	}
	return true
}

func regexSpans(re *regexp2.Regexp, s string) [][2]int {
	var out [][2]int
	regexMatcher{re}.matches(s, func(a, b int) { out = append(out, [2]int{a, b}) })
	return out
}

func scannerSpans(sc scanner, s string) [][2]int {
	var out [][2]int
	sc.matches(s, func(a, b int) { out = append(out, [2]int{a, b}) })
	return out
}

var scannerPatterns = []string{patternGPT4, patternQwen2, patternGPT2}

func checkScanner(t *testing.T, res []*regexp2.Regexp, s string) {
	t.Helper()
	if !comparableWithGo(s) {
		return
	}
	for i, p := range scannerPatterns {
		sc, _ := scannerFor(p)
		got, want := scannerSpans(sc, s), regexSpans(res[i], s)
		if !slices.Equal(got, want) {
			t.Fatalf("pattern %d on %q:\nscanner %v\nregexp2 %v", i, s, got, want)
		}
	}
}

func compileScannerPatterns(t testing.TB) []*regexp2.Regexp {
	var res []*regexp2.Regexp
	for _, p := range scannerPatterns {
		re, err := regexp2.Compile(p, regexp2.None)
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, re)
	}
	return res
}

// scannerSeeds are edge cases for each alternative of the patterns.
var scannerSeeds = []string{
	"", " ", "  ", "\n", " \n", "\n ", "a", " a", "  a", "\ta", "\na", "'s", "'S", "'ll", "'LL", "'Ll", "'re", "'x", "''s",
	"a's", "don't", "123456", "1 2", " 1", "x1y", "!!", " !!", "  !!", "!!\n\n", " !!\r\n x", "a \n b", "a  \n\n  b",
	"   ", "a   ", "   a", "\r\n\r\n", "\t\t\n\t", "é", "e\u0301", "中文 字", "٣٤", "½", "\u00a0a", "\u3000\u3000x", "\u0085x",
	"a\u2028b", "x\ufeffy", "😀😀 a😀", "$$$a", " $a", "'", "' ", "'  s", "I'M", "o'clock", ".\n.", "a\n\nb",
}

// TestScannerMatchesRegexp2 proves the hand scanner equivalent to regexp2 on
// the seeds and on every corpus string.
func TestScannerMatchesRegexp2(t *testing.T) {
	res := compileScannerPatterns(t)
	inputs := append([]string(nil), scannerSeeds...)
	for _, f := range []string{"corpus.jsonl", "extra.jsonl"} {
		inputs = append(inputs, readJSONLines[string](t, filepath.Join("testdata", f))...)
	}
	compared := 0
	for _, s := range inputs {
		if comparableWithGo(s) {
			compared++
		}
		checkScanner(t, res, s)
	}
	// Also every pair of seed atoms, which reaches all alternatives' edges.
	atoms := []string{" ", "\n", "\r", "\t", "\u00a0", "a", "Z", "é", "1", "٣", "'", "s", "LL", "!", "😀", "\u0301", "中"}
	for _, a := range atoms {
		for _, b := range atoms {
			for _, c := range atoms {
				checkScanner(t, res, a+b+c)
				compared++
			}
		}
	}
	if compared < 1000 {
		t.Fatalf("only %d inputs were comparable", compared)
	}
}

// FuzzScannerMatchesRegexp2 checks the scanner against regexp2 on arbitrary
// strings (those regexp2's tables agree on).
func FuzzScannerMatchesRegexp2(f *testing.F) {
	for _, s := range scannerSeeds {
		f.Add(s)
	}
	res := compileScannerPatterns(f)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || len(s) > 4096 {
			return
		}
		checkScanner(t, res, s)
	})
}

// TestRecentUnicodeClasses pins characters that Go's tables (Unicode
// 15.0) do not know but the reference engine (Unicode 17.0) classifies.
func TestRecentUnicodeClasses(t *testing.T) {
	if referenceUnicodeVersion != "17.0" {
		t.Fatalf("tables regenerated for Unicode %s: review this test", referenceUnicodeVersion)
	}
	cases := []struct {
		r    rune
		want charClass
		note string
	}{
		{0x2EBF0, classLetter, "CJK Ext I (15.1)"},
		{0x10D50, classLetter, "Garay letter (16.0)"},
		{0x16130, classNumber, "Gurung Khema digit (16.0)"},
		{0x323B0, classLetter, "CJK Ext J (17.0)"},
		{0x1E6C0, classLetter, "Tai Yo letter (17.0)"},
		{'a', classLetter, "ASCII"},
		{0x0085, classSpace, "NEL is White_Space"},
		{0xFEFF, classOther, "BOM is not White_Space (unlike JS \\s)"},
		{0x00BD, classNumber, "vulgar half is \\p{N}"},
	}
	for _, c := range cases {
		if got := classOf(c.r); got != c.want {
			t.Errorf("%U %s: class %d, want %d", c.r, c.note, got, c.want)
		}
	}
	// Go's own tables lag: make the difference visible, it is why the tables exist.
	if unicode.IsLetter(0x323B0) {
		t.Logf("Go's unicode (%s) now knows CJK Ext J", unicode.Version)
	}
	// And the scanner keeps a new-script word whole, as the reference does.
	sc, _ := scannerFor(patternQwen2)
	got := sc.split(" \U00010D50\U00010D51 x", nil)
	if want := []string{" \U00010D50\U00010D51", " x"}; !slices.Equal(got, want) {
		t.Errorf("split %q, want %q", got, want)
	}
}

// TestRecentCompositions: NFC composes the Unicode 16.0 pairs x/text does
// not know, exactly as the reference engine does.
func TestRecentCompositions(t *testing.T) {
	pairs := readJSONLines[[2]string](t, filepath.Join("testdata", "nfc_recent.jsonl"))
	changed := 0
	for _, p := range pairs {
		got := unicodeForm{norm.NFC}.normalize(p[0])
		if got != p[1] {
			t.Errorf("NFC(%+q) = %+q, want %+q", p[0], got, p[1])
		}
		if p[0] != p[1] {
			changed++
		}
	}
	if changed < 20 {
		t.Errorf("only %d inputs exercise a composition", changed)
	}
}

// TestRegexFallbackRecentUnicode: Split regexes that run on regexp2 see the
// reference's categories too (stand-ins for characters Go does not know).
func TestRegexFallbackRecentUnicode(t *testing.T) {
	re, err := compileHFRegex(`\p{Lo}+|\p{Nd}+|\s+|[^\s\p{L}\p{N}]+`)
	if err != nil {
		t.Fatal(err)
	}
	// CJK Ext J letters (17.0), Garay digits (16.0), a Unicode 16 emoji (So).
	s := "\U000323B0\U000323B1 \U00010D40\U00010D41\U0001FA89!"
	got := regexSpans(re, s)
	want := [][2]int{{0, 8}, {8, 9}, {9, 17}, {17, 22}}
	if !slices.Equal(got, want) {
		t.Errorf("spans %v, want %v", got, want)
	}
}
