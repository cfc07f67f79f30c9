package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// AddedToken is one entry of tokenizer.json's added_tokens.
type AddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// tokenTrie finds added tokens leftmost-longest, like tokenizers'
// AddedVocabulary (Aho-Corasick, MatchKind::LeftmostLongest).
type tokenTrie struct {
	nodes []trieNode
	first [256]bool // bytes that start some token
}

type trieNode struct {
	next  map[byte]int32
	token int32 // index into tokens, -1 if none ends here
}

func newTokenTrie() *tokenTrie {
	return &tokenTrie{nodes: []trieNode{{token: -1}}}
}

func (t *tokenTrie) add(s string, idx int) {
	if s == "" {
		return
	}
	t.first[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		nx, ok := t.nodes[n].next[s[i]]
		if !ok {
			if t.nodes[n].next == nil {
				t.nodes[n].next = make(map[byte]int32)
			}
			t.nodes = append(t.nodes, trieNode{token: -1})
			nx = int32(len(t.nodes) - 1)
			t.nodes[n].next[s[i]] = nx
		}
		n = nx
	}
	t.nodes[n].token = int32(idx)
}

func (t *tokenTrie) empty() bool { return len(t.nodes) == 1 }

// longestAt returns the token index and end of the longest token at s[i:].
func (t *tokenTrie) longestAt(s string, i int) (int, int) {
	best, end := -1, -1
	n := int32(0)
	for j := i; j < len(s); j++ {
		nx, ok := t.nodes[n].next[s[j]]
		if !ok {
			break
		}
		n = nx
		if tok := t.nodes[n].token; tok >= 0 {
			best, end = int(tok), j+1
		}
	}
	return best, end
}

// segment is a piece of input: either an added token (id valid) or text.
type segment struct {
	text    string
	isToken bool
	id      uint32
	atStart bool // text begins at offset 0 of the whole input
	at      int  // byte offset of an added token's match in the split string
}

func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsNumber(r)
}

// splitAdded cuts s at the added tokens of trie, honouring single_word,
// lstrip and rstrip as tokenizers does; text segments may be empty.
func splitAdded(s string, trie *tokenTrie, tokens []AddedToken, atStart bool, dst []segment) []segment {
	if trie == nil || trie.empty() {
		return append(dst, segment{text: s, atStart: atStart})
	}
	textStart := 0
	for i := 0; i < len(s); {
		if !trie.first[s[i]] {
			i++
			continue
		}
		idx, end := trie.longestAt(s, i)
		if idx < 0 {
			i++
			continue
		}
		tok := &tokens[idx]
		start, matchEnd := i, end
		if tok.SingleWord {
			before, _ := utf8.DecodeLastRuneInString(s[:start])
			after, _ := utf8.DecodeRuneInString(s[end:])
			if (start > 0 && isWordChar(before)) || (end < len(s) && isWordChar(after)) {
				i = end // tokenizers skips the whole rejected match
				continue
			}
		}
		if tok.LStrip {
			start = textStart + len(strings.TrimRightFunc(s[textStart:start], unicode.IsSpace))
		}
		if tok.RStrip {
			end += len(s[end:]) - len(strings.TrimLeftFunc(s[end:], unicode.IsSpace))
		}
		if start > textStart {
			dst = append(dst, segment{text: s[textStart:start], atStart: atStart && textStart == 0})
		}
		dst = append(dst, segment{text: s[i:matchEnd], isToken: true, id: tok.ID, at: i})
		textStart, i = end, end
	}
	if textStart < len(s) {
		dst = append(dst, segment{text: s[textStart:], atStart: atStart && textStart == 0})
	}
	return dst
}
