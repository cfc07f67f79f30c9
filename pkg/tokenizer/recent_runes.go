package tokenizer

import (
	"sync"
	"unicode"
)

// categoryStandIns are characters Go's tables know, one per general category,
// none of them ASCII, white space or a letter that case-folds to ASCII.
var categoryStandIns = map[string]rune{
	"Lu": 'Ω', "Ll": 'α', "Lt": 'ǅ', "Lm": 'ʰ', "Lo": 'ا',
	"Mn": '\u0300', "Mc": '\u0903', "Me": '\u20DD',
	"Nd": '٠', "Nl": 'Ⅰ', "No": '²',
	"Pc": '‿', "Pd": '‐', "Ps": '⁅', "Pe": '⁆', "Pi": '«', "Pf": '»', "Po": '§',
	"Sm": '∀', "Sc": '€', "Sk": '˂', "So": '©',
	"Zs": '\u3000', "Zl": '\u2028', "Zp": '\u2029', "Cc": '\u0085', "Cf": '\u200B', "Co": '\uE000',
}

// recentRunes maps each character whose general category in the reference
// engine (categoryRanges) differs from Go's unicode tables to a stand-in of
// the reference category. regexMatcher substitutes them before running
// regexp2, which reads Go's tables; the substitution keeps rune positions, so
// match offsets are unchanged.
var recentRunes = sync.OnceValue(func() map[rune]rune {
	m := map[rune]rune{}
	for _, rg := range categoryRanges {
		name := categoryNames[rg.cat]
		table := unicode.Categories[name]
		stand := categoryStandIns[name]
		if table == nil || stand == 0 {
			continue
		}
		for r := rune(rg.lo); r <= rune(rg.hi); r++ {
			if !unicode.Is(table, r) {
				m[r] = stand
			}
		}
	}
	return m
})
