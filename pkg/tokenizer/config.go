package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Config is the part of tokenizer_config.json kvgate needs: the chat
// template(s), the special-token strings a template may use, and the flags
// that decide whether a BOS/EOS is added to completion prompts.
type Config struct {
	// ChatTemplate is the default chat template ("" when there is none).
	ChatTemplate string
	// ChatTemplates holds named templates when tokenizer_config.json uses
	// the list form ([{"name": ..., "template": ...}]), e.g. "default" and
	// "tool_use"; nil for the plain string form.
	ChatTemplates map[string]string

	BOSToken, EOSToken, PADToken, UNKToken string
	// AdditionalSpecialTokens lists additional_special_tokens.
	AdditionalSpecialTokens []string

	// AddBOSToken and AddEOSToken are nil when tokenizer_config.json does not
	// set them; then the tokenizer.json post-processor alone decides.
	AddBOSToken, AddEOSToken *bool

	TokenizerClass string
}

// maxConfigBytes bounds tokenizer_config.json (templates are at most tens of KB).
const maxConfigBytes = 16 << 20

// LoadConfig reads a tokenizer_config.json. A missing file yields an error
// matching ErrNotFound; callers that treat the config as optional check it.
// A chat_template.jinja beside it (the newer HF layout) is used when the JSON
// has no chat_template.
func LoadConfig(path string) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &notFoundError{path: path, err: err}
		}
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if st.Size() > maxConfigBytes {
		return nil, &ParseError{Path: path, Err: fmt.Errorf("file is %d bytes, limit %d", st.Size(), maxConfigBytes)}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, &ParseError{Path: path, Err: err}
	}
	if cfg.ChatTemplate == "" && cfg.ChatTemplates == nil {
		jinja := filepath.Join(filepath.Dir(path), "chat_template.jinja")
		if b, err := os.ReadFile(jinja); err == nil && len(b) <= maxConfigBytes {
			cfg.ChatTemplate = string(b)
		}
	}
	return cfg, nil
}

type configJSON struct {
	ChatTemplate            json.RawMessage   `json:"chat_template"`
	BOSToken                json.RawMessage   `json:"bos_token"`
	EOSToken                json.RawMessage   `json:"eos_token"`
	PADToken                json.RawMessage   `json:"pad_token"`
	UNKToken                json.RawMessage   `json:"unk_token"`
	AdditionalSpecialTokens []json.RawMessage `json:"additional_special_tokens"`
	AddBOSToken             *bool             `json:"add_bos_token"`
	AddEOSToken             *bool             `json:"add_eos_token"`
	TokenizerClass          string            `json:"tokenizer_class"`
}

// ParseConfig parses tokenizer_config.json bytes.
func ParseConfig(data []byte) (*Config, error) {
	var j configJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, err
	}
	c := &Config{AddBOSToken: j.AddBOSToken, AddEOSToken: j.AddEOSToken, TokenizerClass: j.TokenizerClass}
	var err error
	for _, f := range []struct {
		dst  *string
		raw  json.RawMessage
		name string
	}{{&c.BOSToken, j.BOSToken, "bos_token"}, {&c.EOSToken, j.EOSToken, "eos_token"}, {&c.PADToken, j.PADToken, "pad_token"}, {&c.UNKToken, j.UNKToken, "unk_token"}} {
		if *f.dst, err = tokenString(f.raw); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	for i, raw := range j.AdditionalSpecialTokens {
		s, err := tokenString(raw)
		if err != nil {
			return nil, fmt.Errorf("additional_special_tokens[%d]: %w", i, err)
		}
		c.AdditionalSpecialTokens = append(c.AdditionalSpecialTokens, s)
	}
	if err := c.parseChatTemplate(j.ChatTemplate); err != nil {
		return nil, err
	}
	return c, nil
}

// tokenString reads a special token given as a string, as an AddedToken
// object ({"content": ...}) or as null.
func tokenString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("neither a string nor an object with content: %s", shorten(string(raw), 80))
	}
	return *obj.Content, nil
}

func (c *Config) parseChatTemplate(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		return json.Unmarshal(raw, &c.ChatTemplate)
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return fmt.Errorf("chat_template: neither a string nor a list of {name, template}: %w", err)
	}
	c.ChatTemplates = make(map[string]string, len(named))
	for _, n := range named {
		c.ChatTemplates[n.Name] = n.Template
	}
	c.ChatTemplate = c.ChatTemplates["default"]
	return nil
}

// ErrNoChatTemplate is returned when a chat is encoded for a model whose
// tokenizer_config.json has no chat template (and the request gave none).
var ErrNoChatTemplate = errors.New("tokenizer: no chat template")

// SelectChatTemplate picks the template as transformers' get_chat_template
// does: the named "tool_use" template when tools are given and it exists,
// else the default one.
func (c *Config) SelectChatTemplate(withTools bool) (string, error) {
	if c == nil {
		return "", ErrNoChatTemplate
	}
	if c.ChatTemplates != nil {
		if t, ok := c.ChatTemplates["tool_use"]; ok && withTools {
			return t, nil
		}
		if t, ok := c.ChatTemplates["default"]; ok {
			return t, nil
		}
		if len(c.ChatTemplates) == 1 {
			for _, t := range c.ChatTemplates {
				return t, nil
			}
		}
		return "", fmt.Errorf("%w: named templates but no \"default\"", ErrNoChatTemplate)
	}
	if c.ChatTemplate == "" {
		return "", ErrNoChatTemplate
	}
	return c.ChatTemplate, nil
}

// SpecialTokensMap is what a chat template sees as bos_token, eos_token,
// pad_token and unk_token (only the ones that are set, as in transformers).
func (c *Config) SpecialTokensMap() map[string]string {
	m := map[string]string{}
	if c == nil {
		return m
	}
	for k, v := range map[string]string{"bos_token": c.BOSToken, "eos_token": c.EOSToken, "pad_token": c.PADToken, "unk_token": c.UNKToken} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
