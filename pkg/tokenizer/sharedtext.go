package tokenizer

import "strings"

// sharedText is a cached text made of immutable string segments. An entry
// that extends an earlier one (the next turn of a conversation) keeps the
// earlier entry's segments for the bytes they share and copies only the
// rest, as internal/segslice does for the ids. It also means the cache never
// holds the caller's string: AppendChat renders into a buffer it reuses
// (docs/tokenizer.md, "Decision cost at long context").
type sharedText struct {
	segs []textSegment
	n    int
}

type textSegment struct {
	s    string // non-empty
	held int    // bytes of the string s was cut from, which s keeps alive
}

// maxTextSegments bounds a sharedText's segments: past it, extend copies
// the text into one segment (reads stay a short loop, a long conversation
// does not pin many small strings).
const maxTextSegments = 64

func (t sharedText) Len() int { return t.n }

// held is the bytes of the strings t keeps alive, at least Len.
func (t sharedText) held() int {
	h := 0
	for _, g := range t.segs {
		h += g.held
	}
	return h
}

// prefix is t's first n bytes (all of t when n ≥ Len), sharing its storage.
func (t sharedText) prefix(n int) sharedText {
	if n >= t.n {
		return t
	}
	if n <= 0 {
		return sharedText{}
	}
	out := sharedText{segs: make([]textSegment, 0, len(t.segs)+1), n: n}
	for _, g := range t.segs {
		if n <= len(g.s) {
			out.segs = append(out.segs, textSegment{s: g.s[:n], held: g.held})
			break
		}
		out.segs = append(out.segs, g)
		n -= len(g.s)
	}
	return out
}

// extend is t followed by a copy of tail; t is unchanged.
func (t sharedText) extend(tail string) sharedText {
	if tail == "" {
		return t
	}
	if len(t.segs)+1 > maxTextSegments {
		var b strings.Builder
		b.Grow(t.n + len(tail))
		for _, g := range t.segs {
			b.WriteString(g.s)
		}
		b.WriteString(tail)
		return sharedText{segs: []textSegment{{s: b.String(), held: b.Len()}}, n: b.Len()}
	}
	segs := make([]textSegment, len(t.segs), len(t.segs)+1)
	copy(segs, t.segs)
	c := strings.Clone(tail)
	return sharedText{segs: append(segs, textSegment{s: c, held: len(c)}), n: t.n + len(c)}
}

// commonPrefix is the length of the longest common byte prefix of t and s.
func (t sharedText) commonPrefix(s string) int {
	done := 0
	for _, g := range t.segs {
		k := commonPrefix(g.s, s[done:])
		done += k
		if k < len(g.s) {
			break
		}
	}
	return done
}

func (t sharedText) equal(s string) bool { return t.n == len(s) && t.commonPrefix(s) == len(s) }

// String is the whole text (a copy unless t has one segment); tests only.
func (t sharedText) String() string {
	if len(t.segs) == 1 {
		return t.segs[0].s
	}
	var b strings.Builder
	for _, g := range t.segs {
		b.WriteString(g.s)
	}
	return b.String()
}
