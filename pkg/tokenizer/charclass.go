package tokenizer

import (
	"sort"
	"unicode/utf8"
)

// charClass is what the GPT-style pre-tokenizer regexes ask of a character:
// \p{L}, \p{N}, \s (Unicode White_Space, as Oniguruma and the JS reference
// define it) or anything else. The three sets are disjoint.
type charClass uint8

const (
	classOther charClass = iota
	classLetter
	classNumber
	classSpace
)

type classRange struct {
	lo, hi uint32
	class  charClass
}

// asciiClass is the class of each ASCII byte, precomputed from classRanges.
var asciiClass = func() (t [utf8.RuneSelf]charClass) {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		t[r] = lookupClass(r)
	}
	return t
}()

func lookupClass(r rune) charClass {
	i := sort.Search(len(classRanges), func(i int) bool { return classRanges[i].hi >= uint32(r) })
	if i < len(classRanges) && classRanges[i].lo <= uint32(r) {
		return classRanges[i].class
	}
	return classOther
}

// classOf returns the class of r.
func classOf(r rune) charClass {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	// Hand-rolled binary search: sort.Search's closure costs too much per rune.
	lo, hi := 0, len(classRanges)
	u := uint32(r)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if classRanges[m].hi < u {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(classRanges) && classRanges[lo].lo <= u {
		return classRanges[lo].class
	}
	return classOther
}

// isWhiteSpace reports Unicode White_Space (what Rust's char::is_whitespace
// and Oniguruma's \s test).
func isWhiteSpace(r rune) bool { return classOf(r) == classSpace }
