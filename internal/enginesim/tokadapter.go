package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvgate/kvgate/pkg/chattemplate"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// hfTokenizer adapts a pkg/tokenizer model and the chat template of its
// tokenizer_config.json (rendered by pkg/chattemplate) to the engine's
// Tokenizer.
type hfTokenizer struct {
	tok      *tokenizer.Tokenizer
	template *chattemplate.Template // nil: no tokenizer_config.json chat template
	special  map[string]string      // bos_token, eos_token, … for the template
}

// maxConfigBytes bounds tokenizer_config.json.
const maxConfigBytes = 16 << 20

// LoadTokenizer loads a tokenizer.json, or a directory holding tokenizer.json
// and tokenizer_config.json, the way --tokenizer names it. The chat template
// comes from tokenizer_config.json beside tokenizer.json; without one, chat
// requests are rendered as ChatML.
func LoadTokenizer(path string) (Tokenizer, error) {
	t, err := tokenizer.Load(path)
	if err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	h := &hfTokenizer{tok: t}
	dir := path
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		dir = filepath.Dir(path)
	}
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return h, nil
	case err != nil:
		return nil, fmt.Errorf("enginesim: tokenizer_config.json: %w", err)
	case len(data) > maxConfigBytes:
		return nil, fmt.Errorf("enginesim: tokenizer_config.json is %d bytes, limit %d", len(data), maxConfigBytes)
	}
	if err := h.loadConfig(data); err != nil {
		return nil, fmt.Errorf("enginesim: tokenizer_config.json: %w", err)
	}
	return h, nil
}

func (h *hfTokenizer) loadConfig(data []byte) error {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return err
	}
	h.special = map[string]string{}
	for _, k := range []string{"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"} {
		if s, ok := specialTokenString(cfg[k]); ok {
			h.special[k] = s
		}
	}
	src, err := chatTemplateSource(cfg["chat_template"])
	if err != nil || src == "" {
		return err
	}
	h.template, err = chattemplate.Compile(src)
	return err
}

// specialTokenString reads a special token given as a string or as an
// AddedToken object {"content": ...}.
func specialTokenString(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s, true
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

// chatTemplateSource reads chat_template: a string, or a list of named
// templates of which "default" is used (as transformers does without tools).
func chatTemplateSource(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat_template is neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", fmt.Errorf("chat_template list has no \"default\" template")
}

func (h *hfTokenizer) EncodePrompt(text string, addSpecial bool) ([]uint32, error) {
	return h.tok.Encode(text, addSpecial)
}

func (h *hfTokenizer) EncodeChat(req ChatRequest) ([]uint32, string, error) {
	text, err := h.renderChat(req)
	if err != nil {
		return nil, "", err
	}
	ids, err := h.tok.Encode(text, req.AddSpecialTokens)
	return ids, text, err
}

func (h *hfTokenizer) renderChat(req ChatRequest) (string, error) {
	tmpl := h.template
	if req.ChatTemplate != "" {
		t, err := chattemplate.Compile(req.ChatTemplate)
		if err != nil {
			return "", fmt.Errorf("request chat_template: %w", err)
		}
		tmpl = t
	}
	if tmpl == nil {
		msgs, bad := parseMessages(req.Messages)
		if bad != nil {
			return "", bad
		}
		return renderChatML(msgs, req), nil
	}
	msgs, err := chattemplate.DecodeMessages(req.Messages)
	if err != nil {
		return "", err
	}
	in := chattemplate.ChatInput{
		Messages:             msgs,
		AddGenerationPrompt:  req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		Kwargs:               req.ChatTemplateKwargs,
		SpecialTokens:        h.special,
	}
	if len(req.Tools) > 0 && string(req.Tools) != "null" {
		v, err := chattemplate.DecodeJSON(req.Tools)
		if err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
		list, ok := v.([]any)
		if !ok {
			return "", errors.New("tools must be a list")
		}
		if in.Tools, err = chattemplate.VLLMToolDicts(list, true); err != nil {
			return "", err
		}
	}
	return tmpl.RenderChat(in)
}

func (h *hfTokenizer) Decode(ids []uint32) string { return h.tok.Decode(ids) }

func (h *hfTokenizer) VocabSize() int { return h.tok.VocabSize() }

// renderChatML is the ChatML rendering used when no chat template is
// available.
func renderChatML(msgs []ChatMessage, req ChatRequest) string {
	var b strings.Builder
	for i, m := range msgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content)
		if req.ContinueFinalMessage && i == len(msgs)-1 {
			break
		}
		b.WriteString("<|im_end|>\n")
	}
	if req.AddGenerationPrompt && !req.ContinueFinalMessage {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}
