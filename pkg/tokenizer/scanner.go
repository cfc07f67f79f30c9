package tokenizer

import "unicode/utf8"

// The two pre-tokenizer regexes below cover the GPT-2 and the GPT-4 (cl100k)
// families that byte-level BPE tokenizers use. scanner implements them by hand:
// the same leftmost-first alternation with the same greedy backtracking, on the
// same character classes (classOf), but with no regex engine. It is proven
// equivalent to github.com/dlclark/regexp2 by TestScannerMatchesRegexp2 and
// FuzzScannerMatchesRegexp2.
const (
	// patternGPT4 is Llama-3's split regex (cl100k style, numbers in runs of up to 3).
	patternGPT4 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 is the same with single digits (Qwen2, Qwen2.5, Qwen3).
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is what the ByteLevel pre-tokenizer uses with use_regex=true.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

type scannerKind uint8

const (
	scanGPT4 scannerKind = iota + 1
	scanGPT2
)

// scanner splits text into the matches of one of the known patterns.
type scanner struct {
	kind      scannerKind
	maxDigits int // \p{N}{1,maxDigits}; 0 means unbounded (\p{N}+)
}

// scannerFor returns the hand scanner equivalent to pattern, or false.
func scannerFor(pattern string) (scanner, bool) {
	switch pattern {
	case patternGPT4:
		return scanner{kind: scanGPT4, maxDigits: 3}, true
	case patternQwen2:
		return scanner{kind: scanGPT4, maxDigits: 1}, true
	case patternGPT2:
		return scanner{kind: scanGPT2}, true
	}
	return scanner{}, false
}

// decode returns the rune at s[i:] and its width; invalid UTF-8 has been
// replaced before scanning, so width is at least 1.
func decode(s string, i int) (rune, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func classAt(s string, i int) (charClass, int) {
	if i >= len(s) {
		return classOther, 0
	}
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return classOf(r), w
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i] (case folding is
// ASCII-only, as in the JS reference) and returns its length or 0.
func contraction(s string, i int, foldCase bool) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	lower := func(b byte) byte {
		if foldCase && b >= 'A' && b <= 'Z' {
			return b + 'a' - 'A'
		}
		return b
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return 3
		}
	}
	return 0
}

// runOf returns the end of the run of class c starting at i.
func runOf(s string, i int, c charClass) int {
	for i < len(s) {
		cc, w := classAt(s, i)
		if cc != c {
			break
		}
		i += w
	}
	return i
}

// runOfOther returns the end of the run of characters of class classOther
// (not \s, \p{L}, \p{N}) starting at i.
func runOfOther(s string, i int) int { return runOf(s, i, classOther) }

func isCRLF(b byte) bool { return b == '\r' || b == '\n' }

// whitespaceTail handles the three whitespace alternatives shared by both
// patterns, at i where s[i] is whitespace. withNewlineRule enables \s*[\r\n]+.
func whitespaceTail(s string, i int, withNewlineRule bool) int {
	// j: end of the whitespace run; lastNL: end of its last \r or \n.
	j, lastNL := i, -1
	prev := i
	for j < len(s) {
		cc, w := classAt(s, j)
		if cc != classSpace {
			break
		}
		if isCRLF(s[j]) {
			lastNL = j + 1
		}
		prev = j
		j += w
	}
	if withNewlineRule && lastNL > 0 {
		return lastNL // \s*[\r\n]+
	}
	if j == len(s) {
		return j // \s+(?!\S) at the end of input
	}
	if prev > i {
		return prev // \s+(?!\S): give back the last whitespace character
	}
	return j // \s+
}

// next returns the end of the match that starts at i (< len(s)).
func (sc scanner) next(s string, i int) int {
	if sc.kind == scanGPT2 {
		return sc.nextGPT2(s, i)
	}
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	c, w := classAt(s, i)
	switch c {
	case classLetter:
		return runOf(s, i+w, classLetter)
	case classNumber:
		if sc.maxDigits == 0 {
			return runOf(s, i+w, classNumber)
		}
		j := i + w
		for n := 1; n < sc.maxDigits && j < len(s); n++ {
			cc, ww := classAt(s, j)
			if cc != classNumber {
				break
			}
			j += ww
		}
		return j
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional character present.
	if !isCRLF(s[i]) {
		if c1, _ := classAt(s, i+w); c1 == classLetter {
			return runOf(s, i+w, classLetter)
		}
	}
	if c == classOther {
		return crlfRun(s, runOfOther(s, i+w)) // ?[^\s\p{L}\p{N}]+[\r\n]*
	}
	// c is whitespace.
	if s[i] == ' ' {
		if c1, _ := classAt(s, i+1); c1 == classOther && i+1 < len(s) {
			return crlfRun(s, runOfOther(s, i+1))
		}
	}
	return whitespaceTail(s, i, true)
}

func crlfRun(s string, j int) int {
	for j < len(s) && isCRLF(s[j]) {
		j++
	}
	return j
}

func (sc scanner) nextGPT2(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	start := i
	if s[i] == ' ' && i+1 < len(s) {
		if c1, _ := classAt(s, i+1); c1 != classSpace {
			start = i + 1
		}
	}
	c, w := classAt(s, start)
	switch c {
	case classLetter:
		return runOf(s, start+w, classLetter)
	case classNumber:
		return runOf(s, start+w, classNumber)
	case classOther:
		return runOfOther(s, start+w)
	}
	return whitespaceTail(s, i, false)
}

// split appends to dst the matches of the pattern in s, in order. The matches
// of both patterns cover every character, so they tile s.
func (sc scanner) split(s string, dst []string) []string {
	for i := 0; i < len(s); {
		j := sc.next(s, i)
		dst = append(dst, s[i:j])
		i = j
	}
	return dst
}
