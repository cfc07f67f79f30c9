package enginesim

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// ChatMessage is one chat message after vLLM's "string" content format: a
// list of text parts has been joined with "\n".
type ChatMessage struct {
	Role    string
	Content string
}

// ChatRequest is what a chat request contributes to its prompt: the messages
// and tools verbatim (so a real chat template sees exactly what vLLM's would)
// and the rendering options.
type ChatRequest struct {
	Messages             json.RawMessage
	Tools                json.RawMessage
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	ChatTemplate         string // request override; "" = the model's
	ChatTemplateKwargs   map[string]any
	AddSpecialTokens     bool // vLLM's chat default is false: BOS comes from the template
}

// Tokenizer is what the engine needs from a tokenizer: vLLM's
// tokenizer.encode for completion strings, apply_chat_template for chat, and
// decoding for the synthetic output. LoadTokenizer adapts pkg/tokenizer and
// pkg/chattemplate to it.
type Tokenizer interface {
	// EncodePrompt tokenizes a completion prompt; addSpecial adds BOS/EOS
	// where the tokenizer's post-processor does.
	EncodePrompt(text string, addSpecial bool) ([]uint32, error)
	// EncodeChat renders the chat template and tokenizes the result (with
	// add_special_tokens=false unless the request asks otherwise); it also
	// returns the rendered text.
	EncodeChat(req ChatRequest) ([]uint32, string, error)
	Decode(ids []uint32) string
	// VocabSize bounds valid token ids; 0 means unknown (no check).
	VocabSize() int
}

// byteTokenizer is the built-in fallback: one token per UTF-8 byte (ids
// 0..255), BOS 256 and a ChatML-style chat rendering. It matches no real model:
// use it only where text prompts do not need parity (token-id prompts are
// exact whatever the tokenizer).
type byteTokenizer struct{}

const byteBOS = 256

func (byteTokenizer) EncodePrompt(text string, addSpecial bool) ([]uint32, error) {
	ids := make([]uint32, 0, len(text)+1)
	if addSpecial {
		ids = append(ids, byteBOS)
	}
	for i := 0; i < len(text); i++ {
		ids = append(ids, uint32(text[i]))
	}
	return ids, nil
}

func (t byteTokenizer) EncodeChat(req ChatRequest) ([]uint32, string, error) {
	msgs, bad := parseMessages(req.Messages)
	if bad != nil {
		return nil, "", bad
	}
	text := renderChatML(msgs, req)
	ids, err := t.EncodePrompt(text, req.AddSpecialTokens)
	return ids, text, err
}

func (byteTokenizer) Decode(ids []uint32) string {
	buf := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 256 {
			buf = append(buf, byte(id))
		}
	}
	if !utf8.Valid(buf) {
		return strings.ToValidUTF8(string(buf), "\uFFFD")
	}
	return string(buf)
}

func (byteTokenizer) VocabSize() int { return 0 }

// outputWords is the text the synthetic output draws its tokens from, so the
// generated text reads as words in any vocabulary.
const outputWords = " the quick brown fox jumps over a lazy dog while seven engines share one warm cache and every" +
	" block of tokens flows through the router to the worker that already holds its prefix"

// outputVocabulary tokenizes outputWords once per engine; the synthetic
// output picks among these ids.
func outputVocabulary(t Tokenizer) []uint32 {
	ids, err := t.EncodePrompt(outputWords, false)
	if err != nil || len(ids) == 0 {
		ids, _ = byteTokenizer{}.EncodePrompt(outputWords, false)
	}
	return ids
}

// syntheticOutput returns n deterministic completion tokens for a prompt: the
// same prompt always yields the same text, different prompts differ.
func syntheticOutput(prompt []uint32, vocab []uint32, n int) []uint32 {
	seed := uint64(14695981039346656037)
	for _, id := range prompt {
		seed ^= uint64(id)
		seed *= 1099511628211
	}
	out := make([]uint32, n)
	for i := range out {
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		out[i] = vocab[z%uint64(len(vocab))]
	}
	return out
}
