package tokenizer

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// Model is a tokenizer with its tokenizer_config.json: everything needed to
// turn an OpenAI-style request into the prompt ids vLLM computes.
type Model struct {
	*Tokenizer
	Config

	// promptPrefix/promptSuffix: what /v1/completions adds with
	// add_special_tokens=true.
	promptPrefix, promptSuffix []uint32

	templates       sync.Map     // template source -> compiled template (chat.go)
	cachedOverrides atomic.Int64 // request-supplied templates cached so far
	renderBufs      sync.Pool    // *[]byte: AppendChat's render buffers (chat.go)
}

// LoadModel loads path (a tokenizer.json, or a directory holding one) and the
// tokenizer_config.json beside it, if any.
func LoadModel(path string, opts ...Option) (*Model, error) {
	file, err := resolvePath(path)
	if err != nil {
		return nil, err
	}
	tk, err := Load(file, opts...)
	if err != nil {
		return nil, err
	}
	var cfg Config
	c, err := LoadConfig(filepath.Join(filepath.Dir(file), "tokenizer_config.json"))
	switch {
	case err == nil:
		cfg = *c
	case errors.Is(err, ErrNotFound):
	default:
		return nil, err
	}
	return NewModel(tk, cfg)
}

// NewModel pairs a tokenizer with its config.
func NewModel(tk *Tokenizer, cfg Config) (*Model, error) {
	m := &Model{Tokenizer: tk, Config: cfg}
	m.promptPrefix, m.promptSuffix = tk.post.prefix, tk.post.suffix
	// tokenizer_config.json's add_bos_token / add_eos_token, when present,
	// rebuild the single-sequence template as transformers'
	// update_post_processor does: [bos] $A [eos].
	if cfg.AddBOSToken != nil || cfg.AddEOSToken != nil {
		if err := m.rebuildTemplate(cfg); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// rebuildTemplate sets the prompt prefix and suffix from add_bos_token and
// add_eos_token; one left unset keeps what the post-processor does.
func (m *Model) rebuildTemplate(cfg Config) error {
	tk := m.Tokenizer
	bosAdded := cfg.AddBOSToken != nil && *cfg.AddBOSToken
	eosAdded := cfg.AddEOSToken != nil && *cfg.AddEOSToken
	if cfg.AddBOSToken == nil {
		bosAdded = m.templateHas(cfg.BOSToken, tk.post.prefix)
	}
	if cfg.AddEOSToken == nil {
		eosAdded = m.templateHas(cfg.EOSToken, tk.post.suffix)
	}
	m.promptPrefix, m.promptSuffix = nil, nil
	if bosAdded {
		id, ok := tk.TokenToID(cfg.BOSToken)
		if !ok {
			return fmt.Errorf("tokenizer: add_bos_token is set but bos_token %q is not in the vocabulary", cfg.BOSToken)
		}
		m.promptPrefix = []uint32{id}
	}
	if eosAdded {
		id, ok := tk.TokenToID(cfg.EOSToken)
		if !ok {
			return fmt.Errorf("tokenizer: add_eos_token is set but eos_token %q is not in the vocabulary", cfg.EOSToken)
		}
		m.promptSuffix = []uint32{id}
	}
	return nil
}

func (m *Model) templateHas(token string, ids []uint32) bool {
	id, ok := m.Tokenizer.TokenToID(token)
	if !ok {
		return false
	}
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// EncodePrompt encodes a /v1/completions string prompt as vLLM does:
// tokenizer.encode(prompt, add_special_tokens=...), where addSpecial nil means
// the request did not say, and vLLM's default (true) applies. Whether that adds
// a BOS (or EOS) is the tokenizer's decision: its post-processor, or
// add_bos_token / add_eos_token in tokenizer_config.json.
func (m *Model) EncodePrompt(text string, addSpecial *bool) ([]uint32, error) {
	return m.EncodePromptLimited(text, addSpecial, Limits{})
}

// EncodePromptLimited is EncodePrompt under lim (see Limits).
func (m *Model) EncodePromptLimited(text string, addSpecial *bool, lim Limits) ([]uint32, error) {
	ids, err := m.AppendPromptLimited(nil, text, addSpecial, lim)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// AppendPromptLimited is EncodePromptLimited appending the ids to dst (see
// Tokenizer.AppendEncodeLimited: dst's elements are kept, do not count
// against lim.MaxTokens, and on error dst comes back at its length).
func (m *Model) AppendPromptLimited(dst []uint32, text string, addSpecial *bool, lim Limits) ([]uint32, error) {
	n0 := len(dst)
	add := addSpecial == nil || *addSpecial
	if add {
		dst = append(dst, m.promptPrefix...)
	}
	ids, err := m.Tokenizer.AppendEncodeLimited(dst, text, false, lim)
	if err != nil {
		return ids[:n0], err
	}
	if add {
		ids = append(ids, m.promptSuffix...)
	}
	return ids, nil
}

// PromptSpecialTokens returns the ids EncodePrompt puts before and after the
// text when special tokens are added.
func (m *Model) PromptSpecialTokens() (prefix, suffix []uint32) {
	return append([]uint32(nil), m.promptPrefix...), append([]uint32(nil), m.promptSuffix...)
}
