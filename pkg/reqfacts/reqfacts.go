// Package reqfacts extracts, from one OpenAI-style HTTP request, every fact
// that decides which token ids and block hashes vLLM will compute for it:
// the model (the X-Model header wins over the body), the whole prompt (never a
// truncated prefix), and each request field that changes the ids or the
// hashes.
//
// The package does no tokenizing or hashing; it only reads. It never fails:
// a body it cannot use yields Facts with an empty prompt or model and a
// Problem saying why, so the caller can record the matching guard reason
// (text_empty, model_empty) and take the fallback.
//
// Fields honoured, with why they matter to vLLM's ids or hashes:
//
//	model / X-Model           tokenizer choice; a LoRA adapter's name enters the block extra keys
//	prompt                    str | [str] | [int] | [[int]]; strings are tokenized, ids used verbatim
//	messages                  chat; content is a string or a list of parts
//	tools, documents          rendered by the chat template
//	chat_template             the request's own template (vLLM needs --trust-request-chat-template)
//	chat_template_kwargs      passed to the template (enable_thinking, …)
//	reasoning_effort          injects enable_thinking = (effort != "none") unless set in the kwargs
//	add_generation_prompt     template flag, default true
//	continue_final_message    template flag, default false
//	add_special_tokens        BOS/EOS: default true for completions, false for chat
//	truncate_prompt_tokens    keep only the last N tokens (vLLM truncates on the left)
//	cache_salt                enters the first block's extra keys
package reqfacts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// Kind says which OpenAI API shape the body has.
type Kind int

const (
	// KindUnknown: no usable JSON body (not JSON, not an object, or empty).
	KindUnknown Kind = iota
	// KindCompletion: a body with "prompt" (/v1/completions).
	KindCompletion
	// KindChat: a body with "messages" (/v1/chat/completions).
	KindChat
	// KindResponses: an OpenAI Responses API body (/v1/responses), converted
	// to a chat conversation as vLLM converts it (ConvertResponses).
	KindResponses
	// KindMessages: an Anthropic Messages API body (/v1/messages), converted
	// to a chat conversation as vLLM converts it (ConvertMessages).
	KindMessages
)

func (k Kind) String() string {
	switch k {
	case KindCompletion:
		return "completion"
	case KindChat:
		return "chat"
	case KindResponses:
		return "responses"
	case KindMessages:
		return "messages"
	}
	return "unknown"
}

// Chat reports a kind whose prompt is a conversation rendered by the chat
// template (chat, responses, messages).
func (k Kind) Chat() bool {
	return k == KindChat || k == KindResponses || k == KindMessages
}

// KindFromPath is the API a request path names: vLLM decides how to read a
// body by its route, never by the body's shape. Other paths carry no prompt
// kvgate hashes (KindUnknown). The path excludes the query.
func KindFromPath(path string) Kind {
	switch path {
	case "/v1/chat/completions":
		return KindChat
	case "/v1/completions":
		return KindCompletion
	case "/v1/responses":
		return KindResponses
	case "/v1/messages":
		return KindMessages
	}
	return KindUnknown
}

// Prompt is one completion prompt: text to tokenize, or token ids used as given.
type Prompt struct {
	Text     string
	Tokens   []uint32
	IsTokens bool
}

// Facts are what a routing decision needs to know about one request.
type Facts struct {
	Kind Kind
	// Model is the client's model string; ModelFromHeader says X-Model gave it.
	Model           string
	ModelFromHeader bool
	// LoRA is the adapter name when Model names one of the rule's adapters;
	// it enters the block hashes' extra keys.
	LoRA string

	// Prompts holds the completion prompts. vLLM serves each prompt of a list
	// as its own engine request; all of them are kept.
	Prompts []Prompt
	// Messages holds the chat conversation as a chat template reads it:
	// decoded with chattemplate.DecodeMessages, so nested objects (tool-call
	// arguments, content parts) keep their key order for tojson, as Python's
	// json module does. Content is a string, a list of parts, or nil.
	Messages []map[string]any

	// Template inputs (chat only), decoded the same way.
	Tools              []any
	Documents          []any
	ChatTemplateKwargs map[string]any
	// ChatTemplate is the request's own chat_template ("" when absent).
	ChatTemplate         string
	AddGenerationPrompt  bool // default true
	ContinueFinalMessage bool // default false

	// AddSpecialTokens is nil when the request leaves vLLM's default (true
	// for completions, false for chat).
	AddSpecialTokens *bool
	// TruncatePromptTokens > 0 keeps only the last N prompt tokens; 0 means
	// no truncation (absent, null or -1).
	TruncatePromptTokens int
	// CacheSalt is non-empty when the request salts its cache.
	CacheSalt string

	// Stream reports "stream": true.
	Stream bool
	// User is the body's top-level "user" (a Tier-1 session key source).
	User string
	// Problem says why a prompt or model could not be taken, for logs.
	Problem string
	// NotPromptPath: the request path names no prompt-bearing API
	// (ExtractPath); the body was read for its model only.
	NotPromptPath bool
	// Unsupported is set when vLLM accepts the request but kvgate cannot
	// compute its ids (an image, a value vLLM generates): the
	// kvgate_kv_skip_total cause ("multimodal" or "unpredictable").
	Unsupported string
}

// FirstPrompt is the prompt a list of prompts routes by (see
// gateway's tokenize); ok is false when the request has no completion prompt.
func (f *Facts) FirstPrompt() (p Prompt, ok bool) {
	if f.Kind != KindCompletion || len(f.Prompts) == 0 {
		return Prompt{}, false
	}
	return f.Prompts[0], true
}

// HasPrompt reports whether the request carries a prompt that can be hashed.
func (f *Facts) HasPrompt() bool {
	switch {
	case f.Kind == KindCompletion:
		return len(f.Prompts) > 0
	case f.Kind.Chat():
		return len(f.Messages) > 0
	}
	return false
}

// SpecialTokens resolves add_special_tokens against vLLM's per-API default.
func (f *Facts) SpecialTokens() bool {
	if f.AddSpecialTokens != nil {
		return *f.AddSpecialTokens
	}
	return f.Kind == KindCompletion
}

// Options tune extraction for one rule.
type Options struct {
	// Adapters lists the LoRA adapter names the rule's engines serve; a model
	// string equal to one of them sets Facts.LoRA.
	Adapters []string
	// Messages, when set, keeps the decoded messages of recent chat bodies
	// so that the next turn of a conversation decodes only its new messages
	// (NewMessageCache).
	Messages *MessageCache
}

// body is the subset of an OpenAI request that changes token ids or hashes.
// Fields stay raw so a wrong type in one field never hides the others.
type body struct {
	Model                json.RawMessage `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ChatTemplate         json.RawMessage `json:"chat_template"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
	TruncatePromptTokens json.RawMessage `json:"truncate_prompt_tokens"`
	CacheSalt            json.RawMessage `json:"cache_salt"`
	Stream               json.RawMessage `json:"stream"`
	User                 json.RawMessage `json:"user"`
}

// Extract reads the facts of one request, taking its kind from the body's
// shape ("messages" is chat, "prompt" a completion). headerModel is the
// X-Model header value ("" when absent); it wins over the body's model. A
// body that is not a JSON object gives no model and no prompt: the caller
// records model_empty. The gateway uses ExtractPath, which takes the kind
// from the request path as vLLM does.
func Extract(raw []byte, headerModel string, opts Options) Facts {
	return extract(raw, headerModel, opts, KindUnknown)
}

// ExtractPath reads the facts of one request to path (without its query):
// the path decides how the body is read (KindFromPath), so an Anthropic
// body is never read as OpenAI chat. A path that names no prompt-bearing
// API yields only the model, with NotPromptPath set.
func ExtractPath(path string, raw []byte, headerModel string, opts Options) Facts {
	kind := KindFromPath(path)
	if kind == KindUnknown {
		f := extract(raw, headerModel, opts, kindModelOnly)
		f.NotPromptPath = true
		f.Problem = fmt.Sprintf("path %q is not a prompt-bearing API", path)
		return f
	}
	return extract(raw, headerModel, opts, kind)
}

// kindModelOnly asks extract for the model, stream and user only: the body
// of a path that carries no prompt is not parsed further.
const kindModelOnly Kind = -1

// extract reads the facts; want is the kind the path names, or KindUnknown
// to take it from the body's shape.
func extract(raw []byte, headerModel string, opts Options, want Kind) Facts {
	f := Facts{AddGenerationPrompt: true}
	headerModel = strings.TrimSpace(headerModel)

	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		f.Problem = "body is not a JSON object"
		return f
	}
	chat := want == KindChat || want == KindUnknown
	b, err := scanBody(trimmed, chat, opts.Messages)
	if err != nil {
		f.Problem = fmt.Sprintf("body is not valid JSON: %v", err)
		return f
	}

	if headerModel != "" {
		f.Model, f.ModelFromHeader = headerModel, true
	} else if s, ok := rawString(b.Model); ok {
		f.Model = strings.TrimSpace(s)
	}
	for _, a := range opts.Adapters {
		if a != "" && a == f.Model {
			f.LoRA = a
			break
		}
	}

	f.Stream, _ = rawBool(b.Stream)
	f.User, _ = rawString(b.User)
	switch want {
	case kindModelOnly:
		return f
	case KindResponses, KindMessages:
		f.readConversation(trimmed, want)
	default:
		f.readOpenAI(&b, want)
	}
	if f.Problem != "" {
		// A rejected prompt or conversation leaves nothing to tokenize: the
		// kind says so, which keeps the invariant every later stage relies on
		// (KindCompletion has a prompt, a chat kind a message).
		f.Kind, f.Prompts, f.Messages = KindUnknown, nil, nil
	}
	if f.Model == "" && f.Problem == "" {
		f.Problem = "no model in the body or the X-Model header"
	}
	return f
}

// readOpenAI reads a completions or chat body; want KindUnknown takes the
// kind from the body's shape.
func (f *Facts) readOpenAI(b *scanned, want Kind) {
	if s, ok := rawString(b.CacheSalt); ok {
		f.CacheSalt = s
	}
	if v, ok := rawBool(b.AddSpecialTokens); ok {
		f.AddSpecialTokens = &v
	}
	if n, ok := rawInt(b.TruncatePromptTokens); ok && n > 0 {
		f.TruncatePromptTokens = int(min(n, math.MaxInt32))
	}
	switch {
	case want == KindChat || (want == KindUnknown && present(b.Messages)):
		if !present(b.Messages) {
			f.Problem = "chat body has no messages"
			return
		}
		f.Kind = KindChat
		f.Messages, f.Problem = checkMessages(b.messages, b.messagesErr)
		f.parseTemplateInputs(&b.body)
	case want == KindCompletion || (want == KindUnknown && present(b.Prompt)):
		if !present(b.Prompt) {
			f.Problem = "completion body has no prompt"
			return
		}
		f.Kind = KindCompletion
		f.Prompts, f.Problem = parsePrompt(b.Prompt)
	default:
		f.Problem = "body has neither prompt nor messages"
	}
}

// readConversation converts a Responses or Messages API body into the chat
// conversation vLLM renders. The fields only OpenAI's completions and chat
// APIs have (add_special_tokens, truncate_prompt_tokens, chat_template,
// documents) are not read: vLLM's request models for these APIs ignore them.
func (f *Facts) readConversation(raw []byte, kind Kind) {
	convert := ConvertResponses
	if kind == KindMessages {
		convert = ConvertMessages
	}
	conv, err := convert(raw)
	switch {
	case errors.Is(err, ErrMultimodal):
		f.Kind, f.Unsupported = kind, "multimodal"
		f.Problem = err.Error()
		return
	case errors.Is(err, ErrUnpredictable):
		f.Kind, f.Unsupported = kind, "unpredictable"
		f.Problem = err.Error()
		return
	case err != nil:
		f.Problem = err.Error()
		return
	}
	f.Kind = kind
	f.Messages, f.Tools = conv.Messages, conv.Tools
	f.AddGenerationPrompt, f.ContinueFinalMessage = conv.AddGenerationPrompt, conv.ContinueFinalMessage
	f.ChatTemplateKwargs, f.CacheSalt = conv.ChatTemplateKwargs, conv.CacheSalt
}

func (f *Facts) parseTemplateInputs(b *body) {
	if v, ok := rawBool(b.AddGenerationPrompt); ok {
		f.AddGenerationPrompt = v
	}
	if v, ok := rawBool(b.ContinueFinalMessage); ok {
		f.ContinueFinalMessage = v
	}
	if list, ok := decodeList(b.Tools); ok {
		f.Tools = list
	}
	if list, ok := decodeList(b.Documents); ok {
		f.Documents = list
	}
	if present(b.ChatTemplateKwargs) {
		if v, err := chattemplate.DecodeJSON(b.ChatTemplateKwargs); err == nil {
			if d, ok := v.(*chattemplate.Dict); ok && d.Len() > 0 {
				f.ChatTemplateKwargs = make(map[string]any, d.Len())
				for _, k := range d.Keys() {
					f.ChatTemplateKwargs[k], _ = d.Get(k)
				}
			}
		}
	}
	if s, ok := rawString(b.ChatTemplate); ok {
		f.ChatTemplate = s
	}
	// Newer vLLM derives enable_thinking from reasoning_effort unless the
	// client set it explicitly.
	if effort, ok := rawString(b.ReasoningEffort); ok && effort != "" {
		if _, set := f.ChatTemplateKwargs["enable_thinking"]; !set {
			if f.ChatTemplateKwargs == nil {
				f.ChatTemplateKwargs = map[string]any{}
			}
			f.ChatTemplateKwargs["enable_thinking"] = effort != "none"
		}
	}
}

// parsePrompt reads str | [str] | [int] | [[int]]. Any malformed element
// drops the whole prompt: vLLM would reject the request.
func parsePrompt(raw json.RawMessage) ([]Prompt, string) {
	if s, ok := rawString(raw); ok {
		if s == "" {
			return nil, "prompt is empty"
		}
		return []Prompt{{Text: s}}, ""
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, "prompt is not a string or a list"
	}
	if len(items) == 0 {
		return nil, "prompt is an empty list"
	}
	// A flat list of integers is one token-id prompt.
	if ids, ok := tokenIDs(raw); ok {
		return []Prompt{{Tokens: ids, IsTokens: true}}, ""
	}
	out := make([]Prompt, 0, len(items))
	for i, it := range items {
		if s, ok := rawString(it); ok {
			if s == "" {
				return nil, fmt.Sprintf("prompt[%d] is empty", i)
			}
			out = append(out, Prompt{Text: s})
			continue
		}
		ids, ok := tokenIDs(it)
		if !ok || len(ids) == 0 {
			return nil, fmt.Sprintf("prompt[%d] is neither a string nor a list of token ids", i)
		}
		out = append(out, Prompt{Tokens: ids, IsTokens: true})
	}
	return out, ""
}

// tokenIDs decodes a JSON list of non-negative integers that fit in uint32.
func tokenIDs(raw json.RawMessage) ([]uint32, bool) {
	var nums []json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&nums); err != nil || len(nums) == 0 {
		return nil, false
	}
	ids := make([]uint32, len(nums))
	for i, n := range nums {
		v, err := n.Int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, false
		}
		ids[i] = uint32(v)
	}
	return ids, true
}

func decodeList(raw json.RawMessage) ([]any, bool) {
	if !present(raw) {
		return nil, false
	}
	v, err := chattemplate.DecodeJSON(raw)
	if err != nil {
		return nil, false
	}
	list, ok := v.([]any)
	return list, ok && len(list) > 0
}

// checkMessages checks the messages scanBody decoded (shapeErr: the value
// was not a list of objects).
func checkMessages(msgs []map[string]any, shapeErr error) ([]map[string]any, string) {
	if shapeErr != nil {
		return nil, errNotMessageList.Error()
	}
	if len(msgs) == 0 {
		return nil, "messages is empty"
	}
	for i, m := range msgs {
		if role, ok := m["role"].(string); !ok || role == "" {
			return nil, fmt.Sprintf("messages[%d] has no role", i)
		}
		switch c := m["content"].(type) {
		case nil, string, []any:
		default:
			return nil, fmt.Sprintf("messages[%d].content is a %T, not a string or a list of parts", i, c)
		}
	}
	return msgs, ""
}

// TextContent flattens a message content the way vLLM does for templates
// whose content format is "string": a plain string stays as it is; the text
// of every {"type":"text"} part is joined with "\n". ok is false when the
// content holds a non-text part (an image, audio), which vLLM turns into
// placeholders and multimodal hashes that a router cannot reproduce.
func TextContent(content any) (text string, ok bool) {
	switch c := content.(type) {
	case nil:
		return "", true
	case string:
		return c, true
	case []any:
		parts := make([]string, 0, len(c))
		for _, p := range c {
			switch pv := p.(type) {
			case string:
				parts = append(parts, pv)
			case *chattemplate.Dict:
				typ, _ := pv.Get("type")
				if ts, _ := typ.(string); ts != "text" && ts != "input_text" && ts != "" {
					return "", false
				}
				tv, _ := pv.Get("text")
				t, isStr := tv.(string)
				if !isStr {
					return "", false
				}
				parts = append(parts, t)
			default:
				return "", false
			}
		}
		return strings.Join(parts, "\n"), true
	}
	return "", false
}

// Truncate applies truncate_prompt_tokens: vLLM keeps the last n tokens.
func Truncate(ids []uint32, n int) []uint32 {
	if n > 0 && len(ids) > n {
		return ids[len(ids)-n:]
	}
	return ids
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

func rawString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func rawBool(raw json.RawMessage) (bool, bool) {
	switch string(raw) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

func rawInt(raw json.RawMessage) (int64, bool) {
	if !present(raw) {
		return 0, false
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&n) != nil {
		return 0, false
	}
	v, err := n.Int64()
	if err != nil {
		return 0, false
	}
	return v, true
}
