package tokenizer

import (
	"fmt"

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
	src, fromConfig := req.ChatTemplate, false
	if src == "" {
		var err error
		if src, err = m.Config.SelectChatTemplate(len(req.Tools) > 0); err != nil {
			return "", err
		}
		fromConfig = true
	}
	tmpl, err := m.template(src, fromConfig)
	if err != nil {
		return "", err
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
	return tmpl.RenderChat(chattemplate.ChatInput{
		Messages:             req.Messages,
		Tools:                req.Tools,
		Documents:            req.Documents,
		AddGenerationPrompt:  addGen,
		ContinueFinalMessage: req.ContinueFinalMessage,
		Kwargs:               kwargs,
		SpecialTokens:        m.Config.SpecialTokensMap(),
		Deadline:             req.Limits.Deadline,
	})
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
