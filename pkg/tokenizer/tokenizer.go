// Package tokenizer is a pure-Go, allocation-light implementation of the
// HuggingFace tokenizers pipeline for the models kvgate routes: byte-level BPE
// (GPT-2, Llama-3, Qwen2/2.5/3) and SentencePiece-style BPE (Metaspace, byte
// fallback). It produces exactly the ids HuggingFace produces, which kvgate
// needs to recompute vLLM's prefix block hashes.
//
// Pipeline (as in tokenizers): added tokens are cut out of the raw text, the
// rest is normalized, normalized added tokens are cut out, the pre-tokenizer
// splits the rest into words and the BPE model merges each word; the
// post-processor adds special tokens when asked.
//
// Unicode: the GPT-style split regexes are run by a hand scanner on character
// tables generated from the reference JavaScript engine (see
// referenceUnicodeVersion), not on Go's unicode package, which is older.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Tokenizer is a loaded tokenizer.json. It is immutable after Load apart from
// its internal caches, and safe for concurrent use.
type Tokenizer struct {
	normalizer normalizer
	pre        preTokenizer
	info       preInfo
	model      *bpeModel

	added       []AddedToken
	rawTrie     *tokenTrie // added tokens matched on raw text (normalized=false)
	normTrie    *tokenTrie // added tokens matched on normalized text
	addedByID   map[uint32]*AddedToken
	addedByText map[string]uint32

	post postProcessor

	idToToken stringTable // original vocab strings (byte-level alphabet), by id; "" = none
	vocabSize int

	metaspace *metaspacePre // for Decode
	// spaceMark is the SentencePiece word mark ("▁") Decode turns back into
	// a space, and stripLead whether Decode drops the first leading space.
	spaceMark string
	stripLead bool

	chunks *chunkCache
	scan   *scanner // GPT-4 family scanner when chunking is safe

	scratch sync.Pool // *encodeScratch

	prefixes *prefixCache // nil: disabled (WithConversationCache(0))
	// maxAdded is the longest raw-split added token, in bytes.
	maxAdded int
}

type encodeScratch struct {
	pieces []string
	words  []string
	// stages hold the output of a Sequence pre-tokenizer's stages before
	// the last (alternately, so a stage never writes what it reads).
	stages [2][]string
	segs   []segment
	sub    []segment
	budget *budget // nil: unbounded (see Limits)
}

// Option tunes a Tokenizer.
type Option func(*options)

type options struct {
	wordCache  int
	chunkBytes int
	chunkMin   int
	convBytes  int
	convObs    func(hit bool, reusedBytes int)
}

func defaultOptions() options {
	return options{wordCache: 1 << 16, chunkBytes: 64 << 20, chunkMin: 1024, convBytes: DefaultConversationCacheBytes}
}

// WithConversationCache bounds the prefix cache that makes the encode of a
// growing conversation incremental, in bytes (0 disables it). See
// docs/tokenizer.md, "Decision cost at long context".
func WithConversationCache(bytes int) Option { return func(o *options) { o.convBytes = bytes } }

// WithConversationObserver is called after each lookup of the conversation
// prefix cache (a text long enough to be cached): hit, and the text bytes
// not encoded again. It must be cheap and must not block.
func WithConversationObserver(fn func(hit bool, reusedBytes int)) Option {
	return func(o *options) { o.convObs = fn }
}

// WithWordCache bounds the per-word BPE cache (entries; 0 disables it).
func WithWordCache(words int) Option { return func(o *options) { o.wordCache = words } }

// WithPrefixCache bounds the warm-path chunk cache in bytes of cached text
// (0 disables it). See Encode.
func WithPrefixCache(bytes int) Option { return func(o *options) { o.chunkBytes = bytes } }

// withChunkMin sets the minimum chunk length (tests use small chunks).
func withChunkMin(n int) Option { return func(o *options) { o.chunkMin = n } }

type fileJSON struct {
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

// maxFileBytes bounds what Load reads (the largest public tokenizer.json files
// are ~30 MB).
const maxFileBytes = 256 << 20

// resolvePath turns a directory into its tokenizer.json.
func resolvePath(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", &notFoundError{path: path, err: err}
		}
		return "", fmt.Errorf("tokenizer: %w", err)
	}
	if st.IsDir() {
		return resolvePath(filepath.Join(path, "tokenizer.json"))
	}
	return path, nil
}

// Load reads a tokenizer.json file, or the tokenizer.json inside a directory.
func Load(path string, opts ...Option) (*Tokenizer, error) {
	file, err := resolvePath(path)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.Size() > maxFileBytes {
		return nil, &ParseError{Path: file, Err: fmt.Errorf("file is %d bytes, limit %d", st.Size(), maxFileBytes)}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &notFoundError{path: file, err: err}
		}
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(data, opts...)
	if err != nil {
		var unsup *UnsupportedError
		if errors.As(err, &unsup) {
			return nil, fmt.Errorf("tokenizer: %s: %w", file, err)
		}
		return nil, &ParseError{Path: file, Err: err}
	}
	return t, nil
}

// Parse builds a Tokenizer from tokenizer.json bytes.
func Parse(data []byte, opts ...Option) (*Tokenizer, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if isNull(f.Model) {
		return nil, errors.New("no model")
	}
	t := &Tokenizer{}
	var err error
	if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer, &t.info); err != nil {
		return nil, err
	}
	if t.model, err = newBPE(f.Model, t.info.byteLevel, o.wordCache); err != nil {
		return nil, err
	}
	if t.post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if err := t.buildVocab(f.AddedTokens); err != nil {
		return nil, err
	}
	if err := t.post.resolve(t); err != nil {
		return nil, err
	}
	t.detectChunking(o)
	if o.convBytes > 0 && !t.rawTrie.empty() {
		t.prefixes = newPrefixCache(o.convBytes)
		t.prefixes.observe = o.convObs
		for _, a := range t.added { // all of them: an upper bound of the raw-split ones
			t.maxAdded = max(t.maxAdded, len(a.Content))
		}
	}
	t.metaspace = findMetaspace(t.pre)
	t.spaceMark, t.stripLead = decoderHints(f.Decoder, t.metaspace)
	return t, nil
}

// decoderHints reads what Decode needs from the decoder section: the
// SentencePiece word mark and whether a leading space is stripped (Metaspace
// decoders, or Replace("▁", " ") followed by Strip, as Llama-2 has).
func decoderHints(raw json.RawMessage, ms *metaspacePre) (mark string, stripLead bool) {
	if ms != nil {
		return ms.replacement, ms.scheme != "never"
	}
	s := string(raw)
	if strings.Contains(s, "\u2581") || strings.Contains(s, "▁") || strings.Contains(s, "Metaspace") {
		return "▁", strings.Contains(s, "Strip") || strings.Contains(s, "Metaspace")
	}
	return "", false
}

func findMetaspace(p preTokenizer) *metaspacePre {
	switch v := p.(type) {
	case *metaspacePre:
		return v
	case preSeq:
		for _, q := range v {
			if m := findMetaspace(q); m != nil {
				return m
			}
		}
	}
	return nil
}

func (t *Tokenizer) buildVocab(added []AddedToken) error {
	maxID := uint32(0)
	t.model.vocab.each(func(_ string, id uint32) { maxID = max(maxID, id) })
	for _, a := range added {
		maxID = max(maxID, a.ID)
	}
	if maxID > 1<<24 {
		return fmt.Errorf("token id %d is implausibly large", maxID)
	}
	t.vocabSize = int(maxID) + 1
	byID := make([]string, t.vocabSize) // packed into t.idToToken below
	enc := byteEncoder
	t.model.vocab.each(func(tok string, id uint32) {
		if t.info.byteLevel {
			// Store the original (byte-alphabet) spelling for IDToToken.
			var b strings.Builder
			for i := 0; i < len(tok); i++ {
				b.WriteRune(enc[tok[i]])
			}
			byID[id] = b.String()
		} else {
			byID[id] = tok
		}
	})
	t.added = added
	t.rawTrie, t.normTrie = newTokenTrie(), newTokenTrie()
	t.addedByID = make(map[uint32]*AddedToken, len(added))
	t.addedByText = make(map[string]uint32, len(added))
	for i := range added {
		a := &t.added[i]
		if a.Content == "" {
			return fmt.Errorf("added token %d has empty content", a.ID)
		}
		byID[a.ID] = a.Content
		t.addedByID[a.ID] = a
		t.addedByText[a.Content] = a.ID
		if a.Normalized && t.normalizer != nil {
			t.normTrie.add(t.normalizer.normalize(a.Content), i)
		} else {
			t.rawTrie.add(a.Content, i)
		}
	}
	var err error
	t.idToToken, err = packStrings(byID)
	return err
}

// token returns the vocabulary string of id, "" when there is none.
func (t *Tokenizer) token(id uint32) string {
	if int(id) >= t.idToToken.len() {
		return ""
	}
	return t.idToToken.at(int(id))
}

// detectChunking enables the warm-path chunk cache when the pre-tokenizer is
// the GPT-4 family scanner followed by a plain ByteLevel: then the text can be
// cut at the boundaries safeBoundary finds without changing any id.
func (t *Tokenizer) detectChunking(o options) {
	if o.chunkBytes <= 0 || t.model.prefix != "" || t.model.suffix != "" {
		return
	}
	var parts []preTokenizer
	if seq, ok := t.pre.(preSeq); ok {
		parts = seq
	} else if t.pre != nil {
		parts = []preTokenizer{t.pre}
	}
	if len(parts) == 0 || len(parts) > 2 {
		return
	}
	sp, ok := parts[0].(*splitPre)
	if !ok || sp.fast == nil || sp.fast.kind != scanGPT4 {
		return
	}
	if len(parts) == 2 {
		bl, ok := parts[1].(*byteLevelPre)
		if !ok || bl.addPrefixSpace || bl.regex != nil {
			return
		}
	}
	t.scan = sp.fast
	t.chunks = newChunkCache(o.chunkBytes, o.chunkMin)
}

// maxEncodeBytes bounds one Encode call's input.
const maxEncodeBytes = 64 << 20

// ErrInputTooLarge is returned for inputs above 64 MiB.
var ErrInputTooLarge = errors.New("tokenizer: input larger than 64 MiB")

// Encode returns the ids of text. With addSpecialTokens the post-processor's
// special tokens (e.g. a BOS) are added, as tokenizers' encode does. Invalid
// UTF-8 is replaced by U+FFFD first.
//
// Work is reused across calls that share text: each pre-token's merges are
// cached, and (for GPT-4 style pre-tokenizers) text is cut at boundaries the
// pre-tokenizer can never cross, and each chunk's ids are cached, so a prompt
// whose beginning was seen before only pays for its new part. The ids are
// identical to a cold run.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	return t.EncodeLimited(text, addSpecialTokens, Limits{})
}

// EncodeLimited is Encode under lim: it stops, returning a *LimitError, as
// soon as a bound is crossed, so its cost is bounded by the limits rather
// than by the input. Within the limits its ids equal Encode's.
func (t *Tokenizer) EncodeLimited(text string, addSpecialTokens bool, lim Limits) ([]uint32, error) {
	ids, err := t.AppendEncodeLimited(nil, text, addSpecialTokens, lim)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// AppendEncodeLimited is EncodeLimited appending the ids to dst, so a caller
// can reuse one buffer across requests instead of a fresh 400 KB array per
// 100k-token prompt (docs/tokenizer.md, "Decision cost at long context").
// dst's elements are kept and do not count against lim.MaxTokens. Nothing
// keeps dst after the call: the caches copy what they keep. On error it
// returns dst cut back to its length and the error.
func (t *Tokenizer) AppendEncodeLimited(dst []uint32, text string, addSpecialTokens bool, lim Limits) ([]uint32, error) {
	n0 := len(dst)
	if len(text) > maxEncodeBytes {
		return dst, ErrInputTooLarge
	}
	capHint := len(text)/4 + 8
	if lim.MaxTokens > 0 {
		capHint = min(capHint, lim.MaxTokens+8)
	}
	ids := slices.Grow(dst, capHint)
	if addSpecialTokens {
		ids = append(ids, t.post.prefix...)
	}
	ids, err := t.encodeReusing(text, ids, lim)
	if err != nil {
		return dst[:n0], err
	}
	if addSpecialTokens {
		ids = append(ids, t.post.suffix...)
	}
	return ids, nil
}

func (t *Tokenizer) getScratch() *encodeScratch {
	if s, ok := t.scratch.Get().(*encodeScratch); ok {
		return s
	}
	return &encodeScratch{}
}

func (t *Tokenizer) putScratch(s *encodeScratch) {
	const keep = 1 << 16
	if cap(s.pieces) > keep || cap(s.words) > keep || cap(s.segs) > keep || cap(s.sub) > keep ||
		cap(s.stages[0]) > keep || cap(s.stages[1]) > keep {
		return
	}
	clear(s.pieces[:cap(s.pieces)])
	clear(s.words[:cap(s.words)])
	clear(s.stages[0][:cap(s.stages[0])])
	clear(s.stages[1][:cap(s.stages[1])])
	clear(s.segs[:cap(s.segs)])
	clear(s.sub[:cap(s.sub)])
	s.budget = nil
	t.scratch.Put(s)
}

// encodeText appends the ids of text. With cuts it also records where text
// can be cut (see prefixCache): each raw-split added token's offset plus
// cutOffset, and its index in ids minus idsBase.
func (t *Tokenizer) encodeText(text string, ids []uint32, b *budget, cuts *[]prefixCut, cutOffset, idsBase int) ([]uint32, error) {
	sc := t.getScratch()
	defer t.putScratch(sc)
	sc.budget = b
	sc.segs = splitAdded(text, t.rawTrie, t.added, true, sc.segs[:0])
	for _, seg := range sc.segs {
		if !b.ids(len(ids)) {
			break
		}
		if seg.isToken {
			if cuts != nil {
				*cuts = append(*cuts, prefixCut{at: seg.at + cutOffset, index: len(ids) - idsBase})
			}
			ids = append(ids, seg.id)
			continue
		}
		s := seg.text
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		if t.normTrie.empty() {
			ids = t.encodeSection(s, seg.atStart, ids, sc)
			continue
		}
		sc.sub = splitAdded(s, t.normTrie, t.added, seg.atStart, sc.sub[:0])
		for _, sub := range sc.sub {
			if sub.isToken {
				ids = append(ids, sub.id)
			} else {
				ids = t.encodeSection(sub.text, sub.atStart, ids, sc)
			}
		}
	}
	if err := b.failed(); err != nil {
		return nil, err
	}
	if !b.ids(len(ids)) {
		return nil, b.failed()
	}
	return ids, nil
}

// encodeSection pre-tokenizes and merges one stretch of normalized text.
func (t *Tokenizer) encodeSection(s string, atStart bool, ids []uint32, sc *encodeScratch) []uint32 {
	if s == "" {
		return ids
	}
	if t.chunks != nil && len(s) > t.chunks.min {
		return t.encodeChunked(s, ids, sc)
	}
	return t.encodeWords(s, atStart, ids, sc)
}

func (t *Tokenizer) encodeWords(s string, atStart bool, ids []uint32, sc *encodeScratch) []uint32 {
	sc.pieces = append(sc.pieces[:0], s)
	words := sc.pieces
	if t.pre != nil {
		sc.words = preTokenizeScratch(t.pre, sc.pieces, atStart, sc)
		words = sc.words
	}
	b := sc.budget
	// Every word yields at least one id: too many words fail before merging.
	if !b.ids(len(ids) + len(words) - 1) {
		return ids
	}
	for _, w := range words {
		if !b.word(w) {
			break
		}
		ids = t.model.encodeWord(w, ids)
		if !b.ids(len(ids)) {
			break
		}
	}
	return ids
}

// preTokenizeScratch is pre.preTokenize into sc.words; a Sequence's inner
// stages write into sc.stages instead of a new slice per stage and per
// chunk (that allocation showed in the profile of a long prompt's encode,
// docs/tokenizer.md "Decision cost at long context"). Every pre-tokenizer
// appends to its dst and keeps nothing, so reusing the buffers changes no
// output.
func preTokenizeScratch(pre preTokenizer, pieces []string, atStart bool, sc *encodeScratch) []string {
	seq, ok := pre.(preSeq)
	if !ok || len(seq) < 2 {
		return pre.preTokenize(pieces, atStart, sc.words[:0])
	}
	cur := pieces
	for i, p := range seq[:len(seq)-1] {
		buf := &sc.stages[i%2]
		*buf = p.preTokenize(cur, atStart, (*buf)[:0])
		cur = *buf
	}
	return seq[len(seq)-1].preTokenize(cur, atStart, sc.words[:0])
}

// VocabSize is the number of ids (the highest id plus one), added tokens included.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// IDToToken returns the vocabulary string of id (in the model's alphabet,
// e.g. "Ġhello" for byte-level BPE) and whether id exists.
func (t *Tokenizer) IDToToken(id uint32) (string, bool) {
	tok := t.token(id)
	return tok, tok != ""
}

// TokenToID returns the id of a vocabulary string or added token.
func (t *Tokenizer) TokenToID(token string) (uint32, bool) {
	if id, ok := t.addedByText[token]; ok {
		return id, true
	}
	if t.info.byteLevel {
		dec := byteDecoder
		b := make([]byte, 0, len(token))
		for _, r := range token {
			c, ok := dec[r]
			if !ok {
				return 0, false
			}
			b = append(b, c)
		}
		token = string(b)
	}
	return t.model.vocab.get(token)
}

// AddedTokens returns the added tokens (special or not), sorted by id.
func (t *Tokenizer) AddedTokens() []AddedToken {
	out := append([]AddedToken(nil), t.added...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id uint32) bool {
	a, ok := t.addedByID[id]
	return ok && a.Special
}

// Decode turns ids back into text (best effort: special tokens are kept,
// invalid UTF-8 becomes U+FFFD, unknown ids are skipped).
func (t *Tokenizer) Decode(ids []uint32) string {
	var b []byte
	var runText []byte // non-added tokens, decoded together
	flush := func() {
		if len(runText) == 0 {
			return
		}
		b = append(b, runText...)
		runText = runText[:0]
	}
	for _, id := range ids {
		if a, ok := t.addedByID[id]; ok {
			flush()
			b = append(b, a.Content...)
			continue
		}
		tok := t.token(id)
		if tok == "" {
			continue
		}
		if t.info.byteLevel {
			dec := byteDecoder
			for _, r := range tok {
				if c, ok := dec[r]; ok {
					runText = append(runText, c)
				}
			}
			continue
		}
		if len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>' {
			var v byte
			if _, err := fmt.Sscanf(tok, "<0x%02X>", &v); err == nil {
				runText = append(runText, v)
				continue
			}
		}
		if t.spaceMark != "" {
			tok = strings.ReplaceAll(tok, t.spaceMark, " ")
		}
		runText = append(runText, tok...)
	}
	flush()
	out := string(b)
	if t.stripLead {
		out = strings.TrimPrefix(out, " ")
	}
	return strings.ToValidUTF8(out, "\uFFFD")
}
