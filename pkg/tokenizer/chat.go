package tokenizer

import (
	"fmt"
	"unsafe"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// ChatRequest is the part of a /v1/chat/completions request that decides
// the prompt ids.
type ChatRequest struct {
	// Messages as decoded from the request (use chattemplate.DecodeJSON so
	// nested objects keep their key order for tojson).
	Messages  []map[string]any
	Tools     []any
	Documents []any
	// AddGenerationPrompt nil means vLLM's default, true.
	AddGenerationPrompt  *bool
	ContinueFinalMessage bool
	// ChatTemplateKwargs is the request's chat_template_kwargs (enable_thinking...).
	ChatTemplateKwargs map[string]any
	// ChatTemplate overrides the model's template (request or server
	// --chat-template), "" for the model's own.
	ChatTemplate string
	// ReasoningEffort is the request's reasoning_effort ("" when unset). As
	// in current vLLM it is passed to the template, and sets enable_thinking
	// (effort != "none") unless chat_template_kwargs sets it.
	ReasoningEffort string
	// AddSpecialTokens is the request's add_special_tokens (vLLM's chat
	// default is false: the template writes any BOS itself).
	AddSpecialTokens bool
	// Limits bound the encode of the rendered text (zero: unbounded).
	Limits Limits
}

// maxCachedTemplates bounds compiled request-supplied templates.
const maxCachedTemplates = 16

func (m *Model) template(src string, fromConfig bool) (*chattemplate.Template, error) {
	if v, ok := m.templates.Load(src); ok {
		return v.(*chattemplate.Template), nil
	}
	tmpl, err := chattemplate.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: compile chat template: %w", err)
	}
	if fromConfig || m.cachedOverrides.Add(1) <= maxCachedTemplates {
		v, _ := m.templates.LoadOrStore(src, tmpl)
		return v.(*chattemplate.Template), nil
	}
	return tmpl, nil
}

// RenderChat renders the chat prompt text as vLLM does through transformers'
// apply_chat_template: the model's (or the request's) template with messages,
// tools, documents, add_generation_prompt, the special-token strings of
// tokenizer_config.json and the chat_template_kwargs.
func (m *Model) RenderChat(req ChatRequest) (string, error) {
	tmpl, in, err := m.chatInput(req)
	if err != nil {
		return "", err
	}
	return tmpl.RenderChat(in)
}

// chatInput picks the template and builds the render input of req.
func (m *Model) chatInput(req ChatRequest) (*chattemplate.Template, chattemplate.ChatInput, error) {
	src, fromConfig := req.ChatTemplate, false
	if src == "" {
		var err error
		if src, err = m.Config.SelectChatTemplate(len(req.Tools) > 0); err != nil {
			return nil, chattemplate.ChatInput{}, err
		}
		fromConfig = true
	}
	tmpl, err := m.template(src, fromConfig)
	if err != nil {
		return nil, chattemplate.ChatInput{}, err
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	kwargs := req.ChatTemplateKwargs
	if req.ReasoningEffort != "" {
		kwargs = make(map[string]any, len(req.ChatTemplateKwargs)+2)
		for k, v := range req.ChatTemplateKwargs {
			kwargs[k] = v
		}
		if _, set := kwargs["reasoning_effort"]; !set {
			kwargs["reasoning_effort"] = req.ReasoningEffort
		}
		if _, set := kwargs["enable_thinking"]; !set {
			kwargs["enable_thinking"] = req.ReasoningEffort != "none"
		}
	}
	return tmpl, chattemplate.ChatInput{
		Messages:             req.Messages,
		Tools:                req.Tools,
		Documents:            req.Documents,
		AddGenerationPrompt:  addGen,
		ContinueFinalMessage: req.ContinueFinalMessage,
		Kwargs:               kwargs,
		SpecialTokens:        m.Config.SpecialTokensMap(),
		Deadline:             req.Limits.Deadline,
	}, nil
}

// EncodeChat renders the chat and encodes the rendered text without special
// tokens (unless the request asks for them), which is how vLLM computes chat
// prompt ids. It returns the ids and the rendered text.
func (m *Model) EncodeChat(req ChatRequest) ([]uint32, string, error) {
	rendered, err := m.RenderChat(req)
	if err != nil {
		return nil, "", err
	}
	add := req.AddSpecialTokens
	ids, err := m.EncodePromptLimited(rendered, &add, req.Limits)
	if err != nil {
		return nil, rendered, err
	}
	return ids, rendered, nil
}

// maxPooledRender bounds the render buffers AppendChat keeps for reuse (a
// 1M-token prompt's text); a larger render's buffer is left to the GC.
const maxPooledRender = 4 << 20

// AppendChat is EncodeChat appending the ids to dst, without the rendered
// text: the render is written into a buffer the Model reuses across calls
// and the text never leaves the call (the tokenizer's caches copy what they
// keep), so a warm 100k-token request allocates neither a 400 KB text nor,
// when the caller passes a reused dst (see IDPool), a 400 KB id array
// (docs/tokenizer.md, "Decision cost at long context"). dst's elements are
// kept and do not count against req.Limits.MaxTokens; on error dst comes
// back at its length. The ids equal EncodeChat's.
func (m *Model) AppendChat(dst []uint32, req ChatRequest) ([]uint32, error) {
	tmpl, in, err := m.chatInput(req)
	if err != nil {
		return dst, err
	}
	buf := m.getRenderBuf()
	defer func() { m.putRenderBuf(buf) }()
	if buf, err = tmpl.AppendRenderChat(buf[:0], in); err != nil {
		return dst, err
	}
	// The text shares buf, which is not written again until the encode
	// below has returned and nothing holds the text (see putRenderBuf).
	text := unsafe.String(unsafe.SliceData(buf), len(buf))
	add := req.AddSpecialTokens
	return m.AppendPromptLimited(dst, text, &add, req.Limits)
}

func (m *Model) getRenderBuf() []byte {
	if b, ok := m.renderBufs.Get().(*[]byte); ok {
		return *b
	}
	return nil
}

// putRenderBuf keeps buf for the next AppendChat. The encode that read it
// has returned, and the caches that outlive it (prefix, chunk and word
// caches) hold copies, never the text itself (TestAppendChatReusedBuffers).
func (m *Model) putRenderBuf(buf []byte) {
	if cap(buf) == 0 || cap(buf) > maxPooledRender {
		return
	}
	buf = buf[:0]
	m.renderBufs.Put(&buf)
}
