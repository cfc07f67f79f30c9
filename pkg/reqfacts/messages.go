package reqfacts

import (
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// The Anthropic Messages API (/v1/messages) conversion follows vLLM's
// AnthropicServingMessages._convert_anthropic_to_openai_request
// (vllm/entrypoints/anthropic/serving.py) and its request models
// (vllm/entrypoints/anthropic/protocol.py); docs/tokenizer.md names the
// commits and every rule.

// anthropicBlockTypes are the content block types vLLM's request model
// accepts; any other is a validation error there.
var anthropicBlockTypes = map[string]bool{
	"text": true, "image": true, "tool_use": true, "tool_result": true,
	"tool_reference": true, "thinking": true, "redacted_thinking": true,
}

// billingHeader starts the system text block Claude Code adds per request;
// vLLM drops it so the hash of the system prompt stays stable.
const billingHeader = "x-anthropic-billing-header"

type anthropicMessage struct {
	role    string
	text    string // content when it is a string
	blocks  []*chattemplate.Dict
	isBlock bool
}

// ConvertMessages converts an Anthropic Messages API body into the chat
// request vLLM renders for it.
func ConvertMessages(raw []byte) (*Conversation, error) {
	top, err := decodeObject(raw)
	if err != nil {
		return nil, err
	}
	msgs, err := anthropicMessages(top)
	if err != nil {
		return nil, err
	}
	var out []*chattemplate.Dict
	sys, err := anthropicSystem(top, msgs)
	if err != nil {
		return nil, err
	}
	if sys != nil {
		out = append(out, sys)
	}
	for i, m := range msgs {
		if out, err = appendAnthropicMessage(out, m); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	if len(out) == 0 {
		return nil, invalidf("the conversation converts to no message")
	}
	conv := &Conversation{Messages: toMessages(out), AddGenerationPrompt: true}
	if conv.Tools, err = anthropicTools(top); err != nil {
		return nil, err
	}
	if conv.ChatTemplateKwargs, err = templateKwargs(top); err != nil {
		return nil, err
	}
	effort := ""
	if oc, ok := field(top, "output_config").(*chattemplate.Dict); ok {
		effort, _ = field(oc, "effort").(string)
	}
	conv.ChatTemplateKwargs = withEffort(conv.ChatTemplateKwargs, effort)
	return conv, nil
}

func anthropicMessages(top *chattemplate.Dict) ([]anthropicMessage, error) {
	list, ok := field(top, "messages").([]any)
	if !ok {
		return nil, invalidf("messages is not a list")
	}
	if len(list) == 0 {
		return nil, invalidf("messages is empty")
	}
	out := make([]anthropicMessage, len(list))
	for i, v := range list {
		d, ok := v.(*chattemplate.Dict)
		if !ok {
			return nil, invalidf("messages[%d] is not an object", i)
		}
		role, _ := field(d, "role").(string)
		// protocol.py's normalize_role: Claude Code's non-standard roles.
		switch role {
		case "ctx", "msg":
			role = "user"
		case "user", "assistant", "system":
		default:
			return nil, invalidf("messages[%d].role %q is not user, assistant or system", i, role)
		}
		m := anthropicMessage{role: role}
		switch c := field(d, "content").(type) {
		case string:
			m.text = c
		case []any:
			blocks, err := anthropicBlocks(c)
			if err != nil {
				return nil, fmt.Errorf("messages[%d].content%w", i, err)
			}
			m.blocks, m.isBlock = blocks, true
		default:
			return nil, invalidf("messages[%d].content is not a string or a list of blocks", i)
		}
		out[i] = m
	}
	return out, nil
}

// anthropicBlocks validates content blocks as AnthropicContentBlock does:
// a known type, and each optional field of its declared type.
func anthropicBlocks(list []any) ([]*chattemplate.Dict, error) {
	out := make([]*chattemplate.Dict, len(list))
	for i, v := range list {
		b, ok := v.(*chattemplate.Dict)
		if !ok {
			return nil, invalidf("[%d] is not an object", i)
		}
		typ, _ := field(b, "type").(string)
		if !anthropicBlockTypes[typ] {
			return nil, invalidf("[%d].type %q is not a content block type", i, typ)
		}
		for _, k := range [...]string{"text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"} {
			if _, ok := optString(b, k); !ok {
				return nil, invalidf("[%d].%s is not a string", i, k)
			}
		}
		for _, k := range [...]string{"source", "input"} {
			switch field(b, k).(type) {
			case nil, *chattemplate.Dict:
			default:
				return nil, invalidf("[%d].%s is not an object", i, k)
			}
		}
		switch c := field(b, "content").(type) {
		case nil, string:
		case []any:
			for j, item := range c {
				if _, ok := item.(*chattemplate.Dict); !ok {
					return nil, invalidf("[%d].content[%d] is not an object", i, j)
				}
			}
		default:
			return nil, invalidf("[%d].content is not a string or a list", i)
		}
		out[i] = b
	}
	return out, nil
}

// anthropicSystem is _convert_system_message: the top-level system (a
// string, or its text blocks) and every system-role message's text, joined
// without a separator into one leading system message.
func anthropicSystem(top *chattemplate.Dict, msgs []anthropicMessage) (*chattemplate.Dict, error) {
	var parts []string
	textBlocks := func(blocks []*chattemplate.Dict) {
		for _, b := range blocks {
			text, _ := field(b, "text").(string)
			if field(b, "type") == "text" && text != "" && !strings.HasPrefix(text, billingHeader) {
				parts = append(parts, text)
			}
		}
	}
	switch s := field(top, "system").(type) {
	case nil:
	case string:
		if s != "" {
			parts = append(parts, s)
		}
	case []any:
		blocks, err := anthropicBlocks(s)
		if err != nil {
			return nil, fmt.Errorf("system%w", err)
		}
		textBlocks(blocks)
	default:
		return nil, invalidf("system is not a string or a list of blocks")
	}
	for _, m := range msgs {
		if m.role != "system" {
			continue
		}
		if !m.isBlock {
			parts = append(parts, m.text)
			continue
		}
		textBlocks(m.blocks)
	}
	if len(parts) == 0 {
		return nil, nil
	}
	return dict("role", "system", "content", concat(parts)), nil
}

// appendAnthropicMessage is _convert_messages for one message: tool results
// of a user message become tool messages placed before it, and a user
// message left without content is dropped.
func appendAnthropicMessage(out []*chattemplate.Dict, m anthropicMessage) ([]*chattemplate.Dict, error) {
	if m.role == "system" {
		return out, nil
	}
	msg := dict("role", m.role)
	if !m.isBlock {
		msg.Set("content", m.text)
		return append(out, msg), nil
	}
	var parts []any
	var calls []any
	var reasoning []string
	hasReasoning := false
	for _, b := range m.blocks {
		typ, _ := field(b, "type").(string)
		switch typ {
		case "text":
			if text, _ := field(b, "text").(string); text != "" {
				parts = append(parts, dict("type", "text", "text", text))
			}
		case "image":
			if src, ok := field(b, "source").(*chattemplate.Dict); ok && src.Len() > 0 {
				return nil, fmt.Errorf("%w: an image block", ErrMultimodal)
			}
		case "thinking":
			if t, ok := field(b, "thinking").(string); ok {
				reasoning, hasReasoning = append(reasoning, t), true
			}
		case "tool_use":
			call, err := anthropicToolCall(b)
			if err != nil {
				return nil, err
			}
			calls = append(calls, call)
		case "tool_result":
			var err error
			if out, parts, err = anthropicToolResult(out, parts, b, m.role); err != nil {
				return nil, err
			}
		}
		// redacted_thinking and tool_reference blocks add nothing.
	}
	if hasReasoning {
		msg.Set("reasoning", concat(reasoning))
	}
	if len(calls) > 0 {
		msg.Set("tool_calls", calls)
	}
	if len(parts) > 0 {
		if first, _ := parts[0].(*chattemplate.Dict); len(parts) == 1 && field(first, "type") == "text" {
			msg.Set("content", field(first, "text"))
		} else {
			msg.Set("content", parts)
		}
	}
	if _, hasContent := msg.Get("content"); m.role == "user" && !hasContent {
		return out, nil
	}
	return append(out, msg), nil
}

// anthropicToolCall is _convert_tool_use_block: arguments are Python's
// json.dumps of the input. Without an id vLLM makes one from the clock.
func anthropicToolCall(b *chattemplate.Dict) (*chattemplate.Dict, error) {
	id, _ := field(b, "id").(string)
	if id == "" {
		return nil, fmt.Errorf("%w: a tool_use block without an id gets a time-based id", ErrUnpredictable)
	}
	name, _ := field(b, "name").(string)
	input, ok := field(b, "input").(*chattemplate.Dict)
	if !ok || input.Len() == 0 {
		input = chattemplate.NewDict()
	}
	args, err := chattemplate.PyJSONDumps(input)
	if err != nil {
		return nil, invalidf("tool_use input: %v", err)
	}
	return dict("id", id, "type", "function", "function", dict("name", name, "arguments", args)), nil
}

// anthropicToolResult is _convert_tool_result_block. In a user message the
// result becomes a tool message (text items joined with "\n"); in an
// assistant message it becomes a "Tool result: …" text part.
func anthropicToolResult(out []*chattemplate.Dict, parts []any, b *chattemplate.Dict, role string) ([]*chattemplate.Dict, []any, error) {
	content := field(b, "content")
	if role != "user" {
		switch c := content.(type) {
		case nil:
			return out, append(parts, dict("type", "text", "text", "Tool result: ")), nil
		case string:
			return out, append(parts, dict("type", "text", "text", "Tool result: "+c)), nil
		case []any:
			if len(c) == 0 {
				return out, append(parts, dict("type", "text", "text", "Tool result: ")), nil
			}
		}
		// vLLM writes str(list): Python's repr of the blocks.
		return nil, nil, fmt.Errorf("%w: an assistant tool_result with block content is rendered as Python's repr", ErrUnpredictable)
	}
	text := ""
	switch c := content.(type) {
	case string:
		text = c
	case []any:
		var texts []string
		for _, v := range c {
			item, ok := v.(*chattemplate.Dict)
			if !ok {
				continue // vLLM skips a non-object item (anthropicBlocks rejects them first)
			}
			switch field(item, "type") {
			case "text":
				t, ok := field(item, "text").(string)
				if !ok && field(item, "text") != nil {
					return nil, nil, invalidf("tool_result text is not a string")
				}
				texts = append(texts, t)
			case "image":
				return nil, nil, fmt.Errorf("%w: an image in a tool_result", ErrMultimodal)
			case "tool_reference":
				return nil, nil, fmt.Errorf("%w: a tool_reference in a tool_result adds a tool message with non-text content", ErrUnpredictable)
			}
		}
		text = strings.Join(texts, "\n")
	}
	id, _ := field(b, "tool_use_id").(string)
	return append(out, dict("role", "tool", "tool_call_id", id, "content", text)), parts, nil
}

// anthropicTools is _convert_tools: each tool becomes a chat function tool
// whose parameters are input_schema (with "type":"object" added at its end
// when missing, as AnthropicTool's validator does).
func anthropicTools(top *chattemplate.Dict) ([]any, error) {
	var list []any
	switch v := field(top, "tools").(type) {
	case nil:
		return nil, nil
	case []any:
		list = v
	default:
		return nil, invalidf("tools is not a list")
	}
	out := make([]any, 0, len(list))
	for i, v := range list {
		t, ok := v.(*chattemplate.Dict)
		if !ok {
			return nil, invalidf("tools[%d] is not an object", i)
		}
		name, ok := field(t, "name").(string)
		if !ok {
			return nil, invalidf("tools[%d].name is not a string", i)
		}
		desc, ok := optString(t, "description")
		if !ok {
			return nil, invalidf("tools[%d].description is not a string", i)
		}
		schema, ok := field(t, "input_schema").(*chattemplate.Dict)
		if !ok {
			return nil, invalidf("tools[%d].input_schema is not an object", i)
		}
		if _, has := schema.Get("type"); !has {
			s := chattemplate.NewDict()
			for _, k := range schema.Keys() {
				s.Set(k, field(schema, k))
			}
			s.Set("type", "object")
			schema = s
		}
		var description any
		if _, has := t.Get("description"); has && field(t, "description") != nil {
			description = desc
		}
		fn := dict("name", name, "description", description, "parameters", schema, "defer_loading", field(t, "defer_loading"))
		out = append(out, dict("type", "function", "function", fn))
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
