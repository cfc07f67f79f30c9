package enginesim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// completionRequest holds the /v1/completions fields the simulator reads;
// the rest (temperature, stop, …) are accepted and ignored.
type completionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *int            `json:"max_tokens"`
	MinTokens        *int            `json:"min_tokens"`
	N                *int            `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	CacheSalt        *string         `json:"cache_salt"`
	KVTransferParams map[string]any  `json:"kv_transfer_params"`
}

type chatRequest struct {
	Model                string          `json:"model"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	MinTokens            *int            `json:"min_tokens"`
	N                    *int            `json:"n"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     bool            `json:"add_special_tokens"`
	ChatTemplate         string          `json:"chat_template"`
	ChatTemplateKwargs   map[string]any  `json:"chat_template_kwargs"`
	CacheSalt            *string         `json:"cache_salt"`
	KVTransferParams     map[string]any  `json:"kv_transfer_params"`
}

// generationRequest is the part of a completions or chat request both
// endpoints handle alike. The request types stay flat (not embedding it) so
// JSON decoding errors name the fields as vLLM clients know them.
type generationRequest struct {
	Model            string
	MaxTokens        *int // the endpoint's effective max_tokens
	MinTokens        *int
	N                *int
	Stream           bool
	StreamOptions    *streamOptions
	CacheSalt        *string
	KVTransferParams map[string]any
}

func (r *completionRequest) generation() generationRequest {
	return generationRequest{Model: r.Model, MaxTokens: r.MaxTokens, MinTokens: r.MinTokens, N: r.N, Stream: r.Stream,
		StreamOptions: r.StreamOptions, CacheSalt: r.CacheSalt, KVTransferParams: r.KVTransferParams}
}

// generation uses max_completion_tokens over max_tokens, as vLLM does.
func (r *chatRequest) generation() generationRequest {
	maxTokens := r.MaxTokens
	if r.MaxCompletionTokens != nil {
		maxTokens = r.MaxCompletionTokens
	}
	return generationRequest{Model: r.Model, MaxTokens: maxTokens, MinTokens: r.MinTokens, N: r.N, Stream: r.Stream,
		StreamOptions: r.StreamOptions, CacheSalt: r.CacheSalt, KVTransferParams: r.KVTransferParams}
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              *string         `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ContinueFinalMsg    bool            `json:"continue_final_message"`
	ChatTemplate        string          `json:"chat_template"`
	ChatTemplateKwargs  map[string]any  `json:"chat_template_kwargs"`
}

// badRequest is a client error with vLLM's message.
type badRequest struct {
	status int
	typ    string
	msg    string
}

func (b *badRequest) Error() string { return b.msg }

func invalid(format string, args ...any) *badRequest {
	return &badRequest{status: 400, typ: "BadRequestError", msg: fmt.Sprintf(format, args...)}
}

// parsePrompt decodes a completions prompt: a string, a list of token ids, or
// a one-element list of either. The simulator serves one prompt per request.
func parsePrompt(raw json.RawMessage) (text string, ids []uint32, isText bool, bad *badRequest) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, false, invalid("Either prompt or prompt_embeds must be provided and non-empty.")
	}
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", nil, false, invalid("prompt: %v", err)
		}
		if text == "" {
			return "", nil, false, invalid("Prompt cannot be empty.")
		}
		return text, nil, true, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", nil, false, invalid("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	if len(list) == 0 {
		return "", nil, false, invalid("Prompt cannot be empty.")
	}
	first := strings.TrimSpace(string(list[0]))
	if strings.HasPrefix(first, "\"") || strings.HasPrefix(first, "[") {
		if len(list) != 1 {
			return "", nil, false, invalid("enginesim serves one prompt per request; got %d prompts", len(list))
		}
		return parsePrompt(list[0])
	}
	ids = make([]uint32, len(list))
	for i, el := range list {
		var v int64
		if err := json.Unmarshal(el, &v); err != nil || v < 0 || v > 1<<32-1 {
			return "", nil, false, invalid("prompt[%d]: token ids must be integers in [0, 2^32)", i)
		}
		ids[i] = uint32(v)
	}
	return "", ids, false, nil
}

// parseMessages decodes chat messages in vLLM's "string" content format:
// text parts of a content list are joined with "\n".
func parseMessages(raw json.RawMessage) ([]ChatMessage, *badRequest) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid("messages: field required")
	}
	var in []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, invalid("messages must be a list of {role, content} objects")
	}
	if len(in) == 0 {
		return nil, invalid("messages must not be empty")
	}
	out := make([]ChatMessage, len(in))
	for i, m := range in {
		if m.Role == "" {
			return nil, invalid("messages[%d].role: field required", i)
		}
		out[i].Role = m.Role
		c := strings.TrimSpace(string(m.Content))
		switch {
		case c == "" || c == "null":
		case strings.HasPrefix(c, "\""):
			if err := json.Unmarshal(m.Content, &out[i].Content); err != nil {
				return nil, invalid("messages[%d].content: %v", i, err)
			}
		case strings.HasPrefix(c, "["):
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return nil, invalid("messages[%d].content: %v", i, err)
			}
			texts := make([]string, 0, len(parts))
			for j, p := range parts {
				if p.Type != "text" {
					return nil, invalid("messages[%d].content[%d]: enginesim supports text parts only, got %q", i, j, p.Type)
				}
				texts = append(texts, p.Text)
			}
			out[i].Content = strings.Join(texts, "\n")
		default:
			return nil, invalid("messages[%d].content must be a string or a list of parts", i)
		}
	}
	return out, nil
}

type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"` // null without --enable-prompt-tokens-details, as vLLM
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type completionResponse struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Created          int64              `json:"created"`
	Model            string             `json:"model"`
	Choices          []completionChoice `json:"choices"`
	Usage            *usage             `json:"usage"`
	KVTransferParams map[string]any     `json:"kv_transfer_params"`
}

type chatMessageOut struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []any  `json:"tool_calls"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     any            `json:"logprobs"`
	FinishReason *string        `json:"finish_reason"`
	StopReason   any            `json:"stop_reason"`
}

type chatResponse struct {
	ID               string         `json:"id"`
	Object           string         `json:"object"`
	Created          int64          `json:"created"`
	Model            string         `json:"model"`
	Choices          []chatChoice   `json:"choices"`
	Usage            *usage         `json:"usage"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatStreamChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   any       `json:"stop_reason,omitempty"`
}

type chatStreamChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []chatStreamChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}

type completionStreamChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}
