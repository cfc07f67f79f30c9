package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// preTokenizer splits each piece into smaller pieces (HF "pre_tokenizer").
// atStart tells whether pieces[0] begins at offset 0 of the whole input (for
// Metaspace's prepend_scheme "first").
type preTokenizer interface {
	preTokenize(pieces []string, atStart bool, dst []string) []string
}

type splitBehavior uint8

const (
	behaviorIsolated splitBehavior = iota
	behaviorRemoved
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch strings.ToLower(s) {
	case "isolated", "":
		return behaviorIsolated, nil
	case "removed":
		return behaviorRemoved, nil
	case "mergedwithprevious":
		return behaviorMergedWithPrevious, nil
	case "mergedwithnext":
		return behaviorMergedWithNext, nil
	case "contiguous":
		return behaviorContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// matcher yields the [start,end) spans a pattern matches in s, in order.
type matcher interface {
	matches(s string, fn func(start, end int))
}

// stringMatcher matches a literal string.
type stringMatcher string

func (m stringMatcher) matches(s string, fn func(start, end int)) {
	if m == "" {
		return
	}
	for off := 0; ; {
		i := strings.Index(s[off:], string(m))
		if i < 0 {
			return
		}
		fn(off+i, off+i+len(m))
		off += i + len(m)
	}
}

// regexMatcher runs a pattern on regexp2 (the general fallback).
type regexMatcher struct{ re *regexp2.Regexp }

func (m regexMatcher) matches(s string, fn func(start, end int)) {
	// regexp2 reports rune indexes; convert to byte offsets as we go.
	runes := []rune(s)
	byteOff := make([]int, len(runes)+1)
	for i, off := 0, 0; i < len(runes); i++ {
		byteOff[i] = off
		off += utf8.RuneLen(runes[i])
		byteOff[i+1] = off
	}
	recent := recentRunes()
	for i, r := range runes {
		if r >= 0x0800 {
			if stand, ok := recent[r]; ok {
				runes[i] = stand
			}
		}
	}
	match, err := m.re.FindRunesMatch(runes)
	for err == nil && match != nil {
		if match.Length > 0 {
			fn(byteOff[match.Index], byteOff[match.Index+match.Length])
		}
		match, err = m.re.FindNextMatch(match)
	}
}

func (sc scanner) matches(s string, fn func(start, end int)) {
	for i := 0; i < len(s); {
		j := sc.next(s, i)
		fn(i, j)
		i = j
	}
}

// splitPre is HF's Split pre-tokenizer.
type splitPre struct {
	m        matcher
	behavior splitBehavior
	invert   bool
	// fast is set when m is a scanner with Isolated behaviour: the matches
	// tile the text and are exactly the pieces.
	fast *scanner
}

type span struct {
	start, end int
	delim      bool
}

func (p *splitPre) preTokenize(pieces []string, _ bool, dst []string) []string {
	for _, s := range pieces {
		if p.fast != nil {
			dst = p.fast.split(s, dst)
			continue
		}
		dst = p.splitOne(s, dst)
	}
	return dst
}

func (p *splitPre) splitOne(s string, dst []string) []string {
	var spans []span
	prev := 0
	p.m.matches(s, func(start, end int) {
		if start > prev {
			spans = append(spans, span{prev, start, p.invert})
		}
		spans = append(spans, span{start, end, !p.invert})
		prev = end
	})
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), p.invert})
	}
	return applyBehavior(s, spans, p.behavior, dst)
}

// mergeContiguous joins each run of adjacent delimiters, and each run of
// adjacent non-delimiters, into one span.
func mergeContiguous(spans []span) []span {
	var out []span
	prevMatch := false
	for _, sp := range spans {
		if sp.delim == prevMatch && len(out) > 0 {
			out[len(out)-1].end = sp.end
		} else {
			out = append(out, span{sp.start, sp.end, false})
		}
		prevMatch = sp.delim
	}
	return out
}

// mergeWithPrevious appends each delimiter to the span before it.
func mergeWithPrevious(spans []span) []span {
	var out []span
	prevMatch := false
	for _, sp := range spans {
		if sp.delim && !prevMatch && len(out) > 0 {
			out[len(out)-1].end = sp.end
		} else {
			out = append(out, span{sp.start, sp.end, false})
		}
		prevMatch = sp.delim
	}
	return out
}

// mergeWithNext prepends each delimiter to the span after it (scanning
// backwards, as tokenizers does).
func mergeWithNext(spans []span) []span {
	var out []span
	prevMatch := false
	for i := len(spans) - 1; i >= 0; i-- {
		sp := spans[i]
		if sp.delim && !prevMatch && len(out) > 0 {
			out[len(out)-1].start = sp.start
		} else {
			out = append(out, span{sp.start, sp.end, false})
		}
		prevMatch = sp.delim
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// applyBehavior follows tokenizers' NormalizedString::split.
func applyBehavior(s string, spans []span, b splitBehavior, dst []string) []string {
	var out []span
	switch b {
	case behaviorIsolated:
		out = spans
	case behaviorRemoved:
		for _, sp := range spans {
			if !sp.delim {
				out = append(out, sp)
			}
		}
	case behaviorContiguous:
		out = mergeContiguous(spans)
	case behaviorMergedWithPrevious:
		out = mergeWithPrevious(spans)
	case behaviorMergedWithNext:
		out = mergeWithNext(spans)
	}
	for _, sp := range out {
		if sp.end > sp.start {
			dst = append(dst, s[sp.start:sp.end])
		}
	}
	return dst
}

// byteLevelPre is the ByteLevel pre-tokenizer. The byte-to-unicode mapping
// itself is done by the model, which works on raw bytes.
type byteLevelPre struct {
	addPrefixSpace bool
	regex          *scanner // GPT-2 split when use_regex
}

func (p *byteLevelPre) preTokenize(pieces []string, _ bool, dst []string) []string {
	for _, s := range pieces {
		if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
			s = " " + s
		}
		if p.regex != nil {
			dst = p.regex.split(s, dst)
		} else if s != "" {
			dst = append(dst, s)
		}
	}
	return dst
}

// metaspacePre is the Metaspace pre-tokenizer (SentencePiece style).
type metaspacePre struct {
	replacement string
	scheme      string // always, first, never
	split       bool
}

func (p *metaspacePre) preTokenize(pieces []string, atStart bool, dst []string) []string {
	for i, s := range pieces {
		s = strings.ReplaceAll(s, " ", p.replacement)
		if !strings.HasPrefix(s, p.replacement) &&
			(p.scheme == "always" || (p.scheme == "first" && atStart && i == 0)) {
			s = p.replacement + s
		}
		if !p.split {
			if s != "" {
				dst = append(dst, s)
			}
			continue
		}
		var spans []span
		prev := 0
		stringMatcher(p.replacement).matches(s, func(start, end int) {
			if start > prev {
				spans = append(spans, span{prev, start, false})
			}
			spans = append(spans, span{start, end, true})
			prev = end
		})
		if prev < len(s) {
			spans = append(spans, span{prev, len(s), false})
		}
		dst = applyBehavior(s, spans, behaviorMergedWithNext, dst)
	}
	return dst
}

// funcSplitPre splits on a per-rune predicate with a behaviour (Digits,
// WhitespaceSplit, Punctuation).
type funcSplitPre struct {
	isDelim  func(r rune) bool
	behavior splitBehavior
}

func (p *funcSplitPre) preTokenize(pieces []string, _ bool, dst []string) []string {
	for _, s := range pieces {
		var spans []span
		for i, r := range s {
			w := utf8.RuneLen(r)
			if w < 0 {
				w = 1
			}
			spans = append(spans, span{i, i + w, p.isDelim(r)})
		}
		// Merge runs of non-delimiters first (they are a single split in HF).
		var merged []span
		for _, sp := range spans {
			if n := len(merged); n > 0 && !sp.delim && !merged[n-1].delim {
				merged[n-1].end = sp.end
				continue
			}
			merged = append(merged, sp)
		}
		dst = applyBehavior(s, merged, p.behavior, dst)
	}
	return dst
}

type preSeq []preTokenizer

func (seq preSeq) preTokenize(pieces []string, atStart bool, dst []string) []string {
	cur := pieces
	for i, p := range seq {
		if i == len(seq)-1 {
			return p.preTokenize(cur, atStart, dst)
		}
		cur = p.preTokenize(cur, atStart, nil)
	}
	return append(dst, cur...)
}

// preInfo records what the pipeline needs to know about the pre-tokenizers.
type preInfo struct {
	byteLevel bool // a ByteLevel pre-tokenizer is present: the model works on bytes
}

func parsePreTokenizer(raw json.RawMessage, info *preInfo) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch t.Type {
	case "Sequence":
		return parseSequencePre(raw, info)
	case "Split":
		return parseSplitPre(raw)
	case "ByteLevel":
		var bl struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &bl); err != nil {
			return nil, fmt.Errorf("pre_tokenizer ByteLevel: %w", err)
		}
		info.byteLevel = true
		p := &byteLevelPre{addPrefixSpace: bl.AddPrefixSpace}
		if bl.UseRegex == nil || *bl.UseRegex {
			sc, _ := scannerFor(patternGPT2)
			p.regex = &sc
		}
		return p, nil
	case "Metaspace":
		return parseMetaspacePre(raw)
	case "Digits":
		var d struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("pre_tokenizer Digits: %w", err)
		}
		b := behaviorContiguous
		if d.Individual {
			b = behaviorIsolated
		}
		return &funcSplitPre{isDelim: isNumeric, behavior: b}, nil
	case "WhitespaceSplit":
		return &funcSplitPre{isDelim: unicode.IsSpace, behavior: behaviorRemoved}, nil
	case "Whitespace":
		re, err := compileHFRegex(`\w+|[^\w\s]+`)
		if err != nil {
			return nil, err
		}
		return &splitPre{m: regexMatcher{re}, behavior: behaviorRemoved, invert: true}, nil
	}
	return nil, &UnsupportedError{Component: "pre_tokenizer", Type: t.Type}
}

// parseSequencePre parses a Sequence pre-tokenizer; a sequence of one is
// that one, and an empty one is none.
func parseSequencePre(raw json.RawMessage, info *preInfo) (preTokenizer, error) {
	var sq struct {
		Pre []json.RawMessage `json:"pretokenizers"`
	}
	if err := json.Unmarshal(raw, &sq); err != nil {
		return nil, fmt.Errorf("pre_tokenizer Sequence: %w", err)
	}
	var seq preSeq
	for _, r := range sq.Pre {
		p, err := parsePreTokenizer(r, info)
		if err != nil {
			return nil, err
		}
		if p != nil {
			seq = append(seq, p)
		}
	}
	switch len(seq) {
	case 0:
		return nil, nil
	case 1:
		return seq[0], nil
	}
	return seq, nil
}

// parseSplitPre parses a Split pre-tokenizer. A regex the scanner knows runs
// on the scanner (and, isolated and not inverted, on its fast path); any
// other runs on regexp2.
func parseSplitPre(raw json.RawMessage) (preTokenizer, error) {
	var sp struct {
		Pattern  patternJSON `json:"pattern"`
		Behavior string      `json:"behavior"`
		Invert   bool        `json:"invert"`
	}
	if err := json.Unmarshal(raw, &sp); err != nil {
		return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
	}
	b, err := parseBehavior(sp.Behavior)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
	}
	p := &splitPre{behavior: b, invert: sp.Invert}
	switch {
	case sp.Pattern.String != nil:
		p.m = stringMatcher(*sp.Pattern.String)
	case sp.Pattern.Regex != nil:
		if sc, ok := scannerFor(*sp.Pattern.Regex); ok {
			p.m = sc
			if b == behaviorIsolated && !sp.Invert {
				p.fast = &sc
			}
		} else {
			re, err := compileHFRegex(*sp.Pattern.Regex)
			if err != nil {
				return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
			}
			p.m = regexMatcher{re}
		}
	default:
		return nil, fmt.Errorf("pre_tokenizer Split: no pattern")
	}
	return p, nil
}

// parseMetaspacePre parses a Metaspace pre-tokenizer; the legacy
// add_prefix_space maps onto prepend_scheme as tokenizers does.
func parseMetaspacePre(raw json.RawMessage) (preTokenizer, error) {
	var ms struct {
		Replacement    string `json:"replacement"`
		PrependScheme  string `json:"prepend_scheme"`
		AddPrefixSpace *bool  `json:"add_prefix_space"`
		Split          *bool  `json:"split"`
	}
	if err := json.Unmarshal(raw, &ms); err != nil {
		return nil, fmt.Errorf("pre_tokenizer Metaspace: %w", err)
	}
	p := &metaspacePre{replacement: ms.Replacement, scheme: ms.PrependScheme, split: ms.Split == nil || *ms.Split}
	if p.replacement == "" {
		p.replacement = "\u2581"
	}
	if p.scheme == "" {
		p.scheme = "always"
		if ms.AddPrefixSpace != nil && !*ms.AddPrefixSpace {
			p.scheme = "never"
		}
	}
	switch p.scheme {
	case "always", "first", "never":
	default:
		return nil, fmt.Errorf("pre_tokenizer Metaspace: unknown prepend_scheme %q", p.scheme)
	}
	return p, nil
}

// isNumeric is Rust's char::is_numeric (\p{N}), which Digits uses.
func isNumeric(r rune) bool { return classOf(r) == classNumber }

// compileHFRegex compiles an Oniguruma-style pattern on regexp2 (.NET
// syntax, which shares lookaround, \p{..} and inline (?i:) groups).
func compileHFRegex(pattern string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, &UnsupportedError{Component: "pattern", Type: pattern}
	}
	return re, nil
}
