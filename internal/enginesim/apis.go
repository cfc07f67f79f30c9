package enginesim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/kvgate/kvgate/pkg/chattemplate"
	"github.com/kvgate/kvgate/pkg/reqfacts"
)

// The OpenAI Responses API (/v1/responses) and Anthropic Messages API
// (/v1/messages) as vLLM serves them: the body is converted to a chat
// conversation by the same code kvgate routes with (reqfacts.ConvertResponses,
// reqfacts.ConvertMessages), rendered with the chat template, and answered
// in each API's own shape, streamed as its SSE events. docs/enginesim.md.

const (
	kindResponses = "resp"
	kindMessages  = "msg"
)

// responsesRequest holds the Responses API fields the simulator reads
// besides the conversation.
type responsesRequest struct {
	Model            string         `json:"model"`
	MaxOutputTokens  *int           `json:"max_output_tokens"`
	Stream           bool           `json:"stream"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// messagesRequest holds the Anthropic fields the simulator reads besides
// the conversation; max_tokens is required there.
type messagesRequest struct {
	Model            string         `json:"model"`
	MaxTokens        *int           `json:"max_tokens"`
	Stream           bool           `json:"stream"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// readRawBody reads a request body with the server's size bound.
func readRawBody(r *http.Request) ([]byte, *badRequest) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &badRequest{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: "request body exceeds " + strconv.FormatInt(mbe.Limit, 10) + " bytes"}
		}
		return nil, invalid("reading request body: %v", err)
	}
	return body, nil
}

func (e *Engine) responsesParams(r *http.Request) (genParams, *badRequest) {
	raw, b := readRawBody(r)
	if b != nil {
		return genParams{}, b
	}
	var req responsesRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return genParams{}, invalid("invalid JSON body: %v", err)
	}
	conv, err := reqfacts.ConvertResponses(raw)
	if err != nil {
		return genParams{}, invalid("%v", err)
	}
	g := generationRequest{Model: req.Model, MaxTokens: req.MaxOutputTokens, Stream: req.Stream, KVTransferParams: req.KVTransferParams}
	if conv.CacheSalt != "" {
		g.CacheSalt = &conv.CacheSalt
	}
	return e.conversationParams(kindResponses, conv, g)
}

func (e *Engine) messagesParams(r *http.Request) (genParams, *badRequest) {
	raw, b := readRawBody(r)
	if b != nil {
		return genParams{}, b
	}
	var req messagesRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return genParams{}, invalid("invalid JSON body: %v", err)
	}
	if req.MaxTokens == nil || *req.MaxTokens <= 0 {
		return genParams{}, invalid("max_tokens must be positive")
	}
	conv, err := reqfacts.ConvertMessages(raw)
	if err != nil {
		return genParams{}, invalid("%v", err)
	}
	g := generationRequest{Model: req.Model, MaxTokens: req.MaxTokens, Stream: req.Stream, KVTransferParams: req.KVTransferParams}
	return e.conversationParams(kindMessages, conv, g)
}

// conversationParams renders a converted conversation as the chat endpoint
// renders messages: the same template, tools and flags.
func (e *Engine) conversationParams(kind string, conv *reqfacts.Conversation, g generationRequest) (genParams, *badRequest) {
	lora, b := e.checkModel(g.Model)
	if b != nil {
		return genParams{}, b
	}
	msgs := make([]any, len(conv.Messages))
	for i, m := range conv.Messages {
		d := chattemplate.NewDict()
		for _, k := range [...]string{"role", "content", "reasoning", "tool_calls", "tool_call_id", "name"} {
			if v, ok := m[k]; ok {
				d.Set(k, v)
			}
		}
		msgs[i] = d
	}
	creq := ChatRequest{
		AddGenerationPrompt:  conv.AddGenerationPrompt,
		ContinueFinalMessage: conv.ContinueFinalMessage,
		ChatTemplateKwargs:   conv.ChatTemplateKwargs,
	}
	var err error
	if creq.Messages, err = chattemplate.MarshalJSON(msgs); err != nil {
		return genParams{}, invalid("messages: %v", err)
	}
	if conv.Tools != nil {
		if creq.Tools, err = chattemplate.MarshalJSON(conv.Tools); err != nil {
			return genParams{}, invalid("tools: %v", err)
		}
	}
	ids, _, err := e.tok.EncodeChat(creq)
	if err != nil {
		return genParams{}, invalid("applying chat template: %v", err)
	}
	return e.generationParams(kind, ids, g, lora)
}

// writeAPIError answers in the endpoint's own error shape: Anthropic's for
// /v1/messages (vLLM's AnthropicErrorResponse), OpenAI's otherwise.
func writeAPIError(w http.ResponseWriter, kind string, b *badRequest) {
	if kind != kindMessages {
		writeError(w, b)
		return
	}
	typ := "invalid_request_error"
	if b.status == http.StatusNotFound {
		typ = "not_found_error"
	} else if b.status >= 500 {
		typ = "api_error"
	}
	writeJSON(w, b.status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": b.msg}})
}

// --- response shapes ---

type responsesUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

// responsesObject is vLLM's ResponsesResponse, with the fields the official
// SDKs read.
type responsesObject struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	CreatedAt         int64           `json:"created_at"`
	Status            string          `json:"status"`
	IncompleteDetails map[string]any  `json:"incomplete_details"`
	Instructions      any             `json:"instructions"`
	Model             string          `json:"model"`
	Output            []outputMessage `json:"output"`
	ParallelToolCalls bool            `json:"parallel_tool_calls"`
	Temperature       float64         `json:"temperature"`
	TopP              float64         `json:"top_p"`
	ToolChoice        string          `json:"tool_choice"`
	Tools             []any           `json:"tools"`
	Background        bool            `json:"background"`
	MaxOutputTokens   int             `json:"max_output_tokens"`
	ServiceTier       string          `json:"service_tier"`
	Truncation        string          `json:"truncation"`
	Usage             *responsesUsage `json:"usage"`
	KVTransferParams  map[string]any  `json:"kv_transfer_params,omitempty"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// anthropicMessageObject is vLLM's AnthropicMessagesResponse. Like vLLM it
// reports no cache_read_input_tokens: its converter copies only the prompt
// and completion token counts.
type anthropicMessageObject struct {
	ID               string          `json:"id"`
	Type             string          `json:"type"`
	Role             string          `json:"role"`
	Content          []anthropicText `json:"content"`
	Model            string          `json:"model"`
	StopReason       *string         `json:"stop_reason"`
	StopSequence     *string         `json:"stop_sequence"`
	Usage            anthropicUsage  `json:"usage"`
	KVTransferParams map[string]any  `json:"kv_transfer_params,omitempty"`
}

// stopReason maps vLLM's finish reasons as AnthropicServingMessages does.
func stopReason(finish string) *string {
	r := "end_turn"
	if finish == "length" {
		r = "max_tokens"
	}
	return &r
}

func (rs *responder) responsesObject(status, text string, params map[string]any) responsesObject {
	o := responsesObject{
		ID: rs.id, Object: "response", CreatedAt: rs.created, Status: status, Model: rs.e.cfg.Model,
		Output: []outputMessage{}, ParallelToolCalls: true, Temperature: 1, TopP: 1, ToolChoice: "auto", Tools: []any{},
		MaxOutputTokens: rs.p.maxTokens, ServiceTier: "auto", Truncation: "disabled", KVTransferParams: params,
	}
	if status == "in_progress" {
		return o
	}
	if status == "incomplete" {
		o.IncompleteDetails = map[string]any{"reason": "max_output_tokens"}
	}
	o.Output = []outputMessage{rs.outputMessage("completed", text)}
	u := rs.usage()
	o.Usage = &responsesUsage{
		InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		InputTokensDetails:  map[string]int{"cached_tokens": rs.cachedTokens},
		OutputTokensDetails: map[string]int{"reasoning_tokens": 0, "tool_output_tokens": 0},
	}
	return o
}

// outputMessage is the answer's message item; vLLM gives it no content part
// when the text is empty.
func (rs *responder) outputMessage(status, text string) outputMessage {
	content := []outputText{}
	if status == "completed" && text != "" {
		content = []outputText{{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}}
	}
	return outputMessage{ID: "msg_" + rs.id, Type: "message", Status: status, Role: "assistant", Content: content}
}

func responsesStatus(finish string) string {
	if finish == "length" {
		return "incomplete"
	}
	return "completed"
}

// writeConversationResponse answers a finished non-streamed Responses or
// Messages request.
func (rs *responder) writeConversationResponse(finish, text string, params map[string]any) {
	if rs.p.kind == kindResponses {
		writeJSON(rs.w, http.StatusOK, rs.responsesObject(responsesStatus(finish), text, params))
		return
	}
	u := rs.usage()
	writeJSON(rs.w, http.StatusOK, anthropicMessageObject{
		ID: rs.id, Type: "message", Role: "assistant", Content: []anthropicText{{Type: "text", Text: text}}, Model: rs.e.cfg.Model,
		StopReason: stopReason(finish), Usage: anthropicUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens},
		KVTransferParams: params,
	})
}

// event writes one named SSE event, as vLLM's routers for both APIs do.
func (rs *responder) event(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = rs.w.Write([]byte("event: " + name + "\ndata: "))
	_, _ = rs.w.Write(b)
	_, _ = rs.w.Write([]byte("\n\n"))
	if f, ok := rs.w.(http.Flusher); ok {
		f.Flush()
	}
}

// responsesEvent writes a Responses API event with its sequence number.
func (rs *responder) responsesEvent(typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = rs.seq
	rs.seq++
	rs.event(typ, fields)
}

// handleConversationStream sends one output of a streamed Responses or
// Messages request; it returns true when the stream is done.
func (rs *responder) handleConversationStream(out stepOutput) bool {
	if !rs.started {
		rs.startStream()
	}
	if out.first {
		rs.startConversationStream()
	}
	if len(out.tokens) > 0 {
		if d := rs.delta(); d != "" {
			rs.text += d
			rs.conversationDelta(d)
		}
	}
	if !out.finished {
		return false
	}
	rs.finishConversationStream(out.finishReason)
	return true
}

func (rs *responder) startConversationStream() {
	if rs.p.kind == kindResponses {
		rs.responsesEvent("response.created", map[string]any{"response": rs.responsesObject("in_progress", "", nil)})
		rs.responsesEvent("response.in_progress", map[string]any{"response": rs.responsesObject("in_progress", "", nil)})
		rs.responsesEvent("response.output_item.added", map[string]any{"output_index": 0, "item": rs.outputMessage("in_progress", "")})
		rs.responsesEvent("response.content_part.added", map[string]any{"output_index": 0, "content_index": 0, "item_id": "msg_" + rs.id,
			"part": outputText{Type: "output_text", Text: "", Annotations: []any{}, Logprobs: []any{}}})
		return
	}
	rs.event("message_start", map[string]any{"type": "message_start", "message": anthropicMessageObject{
		ID: rs.id, Type: "message", Role: "assistant", Content: []anthropicText{}, Model: rs.e.cfg.Model,
		Usage: anthropicUsage{InputTokens: len(rs.p.prompt)},
	}})
	rs.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": anthropicText{Type: "text", Text: ""}})
}

func (rs *responder) conversationDelta(d string) {
	if rs.p.kind == kindResponses {
		rs.responsesEvent("response.output_text.delta", map[string]any{"output_index": 0, "content_index": 0, "item_id": "msg_" + rs.id, "delta": d, "logprobs": []any{}})
		return
	}
	rs.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": d}})
}

func (rs *responder) finishConversationStream(finish string) {
	if rs.p.kind == kindResponses {
		id := "msg_" + rs.id
		part := outputText{Type: "output_text", Text: rs.text, Annotations: []any{}, Logprobs: []any{}}
		rs.responsesEvent("response.output_text.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": id, "text": rs.text, "logprobs": []any{}})
		rs.responsesEvent("response.content_part.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": id, "part": part})
		rs.responsesEvent("response.output_item.done", map[string]any{"output_index": 0, "item": rs.outputMessage("completed", rs.text)})
		rs.responsesEvent("response.completed", map[string]any{"response": rs.responsesObject(responsesStatus(finish), rs.text, nil)})
		return
	}
	u := rs.usage()
	rs.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	rs.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stopReason(finish), "stop_sequence": nil},
		"usage": anthropicUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}})
	rs.event("message_stop", map[string]any{"type": "message_stop"})
}
