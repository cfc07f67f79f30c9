// Package usageaudit reads the usage an engine reports in its responses
// (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens) from the
// response bytes kvgate relays, so the gateway can compare them with its own
// prompt token count and predicted overlap (docs/parity.md, "Per-request
// usage audit").
//
// Everything here reads untrusted engine bytes: every buffer is bounded, a
// malformed body is an unparsed one (never a panic), and the work per body
// byte is constant.
package usageaudit

import (
	"bytes"
	"encoding/json"
	"sync/atomic"
)

// Usage is what one response reported.
type Usage struct {
	// PromptTokens is usage.prompt_tokens.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; meaningful
	// only when HasCached.
	CachedTokens int
	// HasCached is false when prompt_tokens_details (or its cached_tokens)
	// is absent or null: vLLM started without --enable-prompt-tokens-details,
	// or (vLLM omits it then too) a request with no cache hit.
	HasCached bool
}

// maxTokenCount bounds a reported count: no engine serves a prompt this
// long, so a larger value is garbage rather than a count.
const maxTokenCount = 1 << 30

// wireCounts is a usage object in any of the shapes vLLM serves: chat and
// completions (prompt_tokens, prompt_tokens_details.cached_tokens), the
// Responses API (input_tokens, input_tokens_details.cached_tokens) and the
// Anthropic Messages API (input_tokens, which vLLM sets to the prompt's
// tokens; it reports no cached count there).
type wireCounts struct {
	PromptTokens  *int64       `json:"prompt_tokens"`
	InputTokens   *int64       `json:"input_tokens"`
	PromptDetails *wireDetails `json:"prompt_tokens_details"`
	InputDetails  *wireDetails `json:"input_tokens_details"`
}

type wireDetails struct {
	CachedTokens *int64 `json:"cached_tokens"`
}

// wireDoc finds the usage object: top level (chat, completions, a Messages
// response or message_delta event), inside "response" (the Responses API's
// response.completed event) or inside "message" (message_start).
type wireDoc struct {
	Usage    *wireCounts `json:"usage"`
	Response *struct {
		Usage *wireCounts `json:"usage"`
	} `json:"response"`
	Message *struct {
		Usage *wireCounts `json:"usage"`
	} `json:"message"`
}

func (d *wireDoc) counts() *wireCounts {
	switch {
	case d.Usage != nil:
		return d.Usage
	case d.Response != nil && d.Response.Usage != nil:
		return d.Response.Usage
	case d.Message != nil && d.Message.Usage != nil:
		return d.Message.Usage
	}
	return nil
}

// ParseJSON reads the usage object of one JSON document (a non-streamed
// response body, or the payload of one SSE data event). ok is false when the
// document does not parse, has no usage object, or its prompt count
// (prompt_tokens, else input_tokens) is missing, not an integer or out of
// range.
func ParseJSON(doc []byte) (u Usage, ok bool) {
	doc = bytes.TrimSpace(doc)
	if len(doc) == 0 || doc[0] != '{' || !bytes.Contains(doc, []byte(`"usage"`)) {
		return Usage{}, false
	}
	var w wireDoc
	if err := json.Unmarshal(doc, &w); err != nil {
		return Usage{}, false
	}
	c := w.counts()
	if c == nil {
		return Usage{}, false
	}
	prompt, details := c.PromptTokens, c.PromptDetails
	if prompt == nil {
		prompt, details = c.InputTokens, c.InputDetails
	}
	if prompt == nil || *prompt < 0 || *prompt > maxTokenCount {
		return Usage{}, false
	}
	u.PromptTokens = int(*prompt)
	if details != nil && details.CachedTokens != nil {
		ct := *details.CachedTokens
		if ct < 0 || ct > maxTokenCount {
			return Usage{}, false
		}
		u.CachedTokens, u.HasCached = int(ct), true
	}
	return u, true
}

// Sampler takes 1 in N: Take is true on the Nth, 2Nth, … call. N = 0 never
// takes, N = 1 always does. Safe for concurrent use.
type Sampler struct {
	n     uint64
	count atomic.Uint64
}

// NewSampler returns a 1-in-n sampler (n ≤ 0: never).
func NewSampler(n int) *Sampler {
	if n < 0 {
		n = 0
	}
	return &Sampler{n: uint64(n)}
}

// Take reports whether this call is sampled.
func (s *Sampler) Take() bool {
	if s == nil || s.n == 0 {
		return false
	}
	return s.count.Add(1)%s.n == 0
}
