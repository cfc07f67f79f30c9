package enginesim

import (
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// hfTokenizer adapts a pkg/tokenizer model (and, when present, the chat
// template of tokenizer_config.json) to the engine's Tokenizer.
type hfTokenizer struct {
	tok *tokenizer.Tokenizer
}

// LoadTokenizer loads a tokenizer.json, or a directory holding tokenizer.json
// and tokenizer_config.json, the way --tokenizer names it.
func LoadTokenizer(path string) (Tokenizer, error) {
	t, err := tokenizer.Load(path)
	if err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	return &hfTokenizer{tok: t}, nil
}

func (h *hfTokenizer) EncodePrompt(text string, addSpecial bool) ([]uint32, error) {
	return h.tok.Encode(text, addSpecial)
}

func (h *hfTokenizer) EncodeChat(msgs []ChatMessage, opts ChatOptions) ([]uint32, string, error) {
	text := renderChatML(msgs, opts)
	ids, err := h.tok.Encode(text, opts.AddSpecialTokensPrompts)
	return ids, text, err
}

func (h *hfTokenizer) Decode(ids []uint32) string { return h.tok.Decode(ids) }

func (h *hfTokenizer) VocabSize() int { return h.tok.VocabSize() }

// renderChatML is the ChatML rendering used when no chat template is
// available.
func renderChatML(msgs []ChatMessage, opts ChatOptions) string {
	var b strings.Builder
	for i, m := range msgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content)
		if opts.ContinueFinalMessage && i == len(msgs)-1 {
			break
		}
		b.WriteString("<|im_end|>\n")
	}
	if opts.AddGenerationPrompt && !opts.ContinueFinalMessage {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}
