package reqfacts

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// The OpenAI Responses API (/v1/responses) conversion follows vLLM's
// OpenAIServingResponses._make_request (vllm/entrypoints/openai/responses/
// serving.py): construct_input_messages and construct_tool_dicts
// (responses/utils.py), ResponsesRequest.build_chat_params and its
// function_call_parsing validator (responses/protocol.py). docs/tokenizer.md
// names the commits and every rule.

// ConvertResponses converts a Responses API body into the chat request vLLM
// renders for it.
func ConvertResponses(raw []byte) (*Conversation, error) {
	top, err := decodeObject(raw)
	if err != nil {
		return nil, err
	}
	var out []*chattemplate.Dict
	instructions, ok := optString(top, "instructions")
	if !ok {
		return nil, invalidf("instructions is not a string")
	}
	if instructions != "" {
		out = append(out, dict("role", "system", "content", instructions))
	}
	cont := false
	switch in := field(top, "input").(type) {
	case string:
		out = append(out, dict("role", "user", "content", in))
	case []any:
		if len(in) == 0 {
			return nil, invalidf("input is an empty list")
		}
		items, err := responseItems(in)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		cont = continueFinal(in[len(in)-1])
	default:
		return nil, invalidf("input is not a string or a list of items")
	}
	conv := &Conversation{Messages: toMessages(out), AddGenerationPrompt: !cont, ContinueFinalMessage: cont}
	if conv.Tools, err = responseTools(top); err != nil {
		return nil, err
	}
	if s, ok := optString(top, "cache_salt"); ok {
		conv.CacheSalt = s
	}
	// build_chat_params passes reasoning.effort to the template as
	// reasoning_effort (ResponsesRequest has no chat_template_kwargs).
	if r, ok := field(top, "reasoning").(*chattemplate.Dict); ok {
		if effort, ok := field(r, "effort").(string); ok {
			conv.ChatTemplateKwargs = withEffort(map[string]any{"reasoning_effort": effort}, effort)
		}
	}
	return conv, nil
}

// continueFinal is should_continue_final_message: a last item that is a
// message or reasoning item still in progress is continued, not answered.
func continueFinal(last any) bool {
	d, ok := last.(*chattemplate.Dict)
	if !ok {
		return false
	}
	typ := "message"
	if t, ok := field(d, "type").(string); ok {
		typ = t
	}
	if typ != "message" && typ != "reasoning" {
		return false // function_call items are parsed into models, never continued
	}
	status, _ := field(d, "status").(string)
	return status == "in_progress" || status == "incomplete"
}

// responseItems is construct_chat_messages_with_tool_call: each item becomes
// a message or is merged into the assistant message before it.
func responseItems(items []any) ([]*chattemplate.Dict, error) {
	var out []*chattemplate.Dict
	for i, v := range items {
		item, ok := v.(*chattemplate.Dict)
		if !ok {
			return nil, invalidf("input[%d] is not an object", i)
		}
		var prevAssistant *chattemplate.Dict
		if n := len(out); n > 0 && field(out[n-1], "role") == "assistant" {
			prevAssistant = out[n-1]
		}
		msg, err := responseItem(item, prevAssistant)
		if err != nil {
			return nil, fmt.Errorf("input[%d]: %w", i, err)
		}
		if msg != nil {
			out = append(out, msg)
		}
	}
	return out, nil
}

// responseItem is _construct_message_from_response_item for one item: a new
// message, or nil when the item was merged into prev.
func responseItem(item, prev *chattemplate.Dict) (*chattemplate.Dict, error) {
	typ, _ := field(item, "type").(string)
	role, _ := field(item, "role").(string)
	switch {
	case typ == "function_call":
		call, err := functionCall(item)
		if err != nil {
			return nil, err
		}
		if prev != nil {
			switch calls := field(prev, "tool_calls").(type) {
			case nil:
				prev.Set("tool_calls", []any{call})
				return nil, nil
			case []any:
				prev.Set("tool_calls", append(calls, call))
				return nil, nil
			}
		}
		return dict("role", "assistant", "tool_calls", []any{call}), nil
	case typ == "function_call_output":
		out := field(item, "output")
		if err := checkParts(out); err != nil {
			return nil, err
		}
		return dict("role", "tool", "content", out, "tool_call_id", field(item, "call_id")), nil
	case typ == "reasoning":
		text := firstText(field(item, "content"))
		if text == "" {
			if c, _ := field(item, "content").([]any); len(c) == 0 {
				text = firstText(field(item, "summary"))
			}
		}
		if prev != nil && field(prev, "reasoning") == nil {
			prev.Set("reasoning", text)
			return nil, nil
		}
		return dict("role", "assistant", "reasoning", text), nil
	case role == "assistant":
		text := ""
		switch c := field(item, "content").(type) {
		case string:
			text = c
		case []any:
			text = firstText(c)
		}
		if prev != nil && field(prev, "content") == nil {
			prev.Set("content", text)
			return nil, nil
		}
		return dict("role", "assistant", "content", text), nil
	case role != "":
		// User, system and developer messages go to the chat parser as they
		// are; it reads role and content (input_text parts are text).
		content := field(item, "content")
		if err := checkParts(content); err != nil {
			return nil, err
		}
		switch content.(type) {
		case string, []any:
		default:
			return nil, invalidf("content is not a string or a list of parts")
		}
		return dict("role", role, "content", content), nil
	}
	return nil, invalidf("item type %q is not a message, function_call, function_call_output or reasoning item", typ)
}

// functionCall is the chat tool call for a function_call item, which
// function_call_parsing turns into a ResponseFunctionToolCall (call_id,
// name and arguments are required strings).
func functionCall(item *chattemplate.Dict) (*chattemplate.Dict, error) {
	var got [3]string
	for i, k := range [...]string{"call_id", "name", "arguments"} {
		s, ok := field(item, k).(string)
		if !ok {
			return nil, invalidf("function_call %s is not a string", k)
		}
		got[i] = s
	}
	name := got[1]
	if ns, _ := field(item, "namespace").(string); ns != "" {
		name = flatName(ns, name)
	}
	return dict("id", got[0], "function", dict("name", name, "arguments", got[2]), "type", "function"), nil
}

// firstText is the text of a content list's first element (a part's
// "text", or the element itself when it is a string), "" otherwise.
func firstText(v any) string {
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		return ""
	}
	switch x := list[0].(type) {
	case string:
		return x
	case *chattemplate.Dict:
		s, _ := field(x, "text").(string)
		return s
	}
	return ""
}

// responseTools is construct_tool_dicts: function tools (and the function
// tools of a namespace, named namespace__name) become chat function tools
// holding every field but "type"; other tool types (web search, MCP, …)
// never reach the template.
func responseTools(top *chattemplate.Dict) ([]any, error) {
	var list []any
	switch v := field(top, "tools").(type) {
	case nil:
		return nil, nil
	case []any:
		list = v
	default:
		return nil, invalidf("tools is not a list")
	}
	var out []any
	for i, v := range list {
		t, ok := v.(*chattemplate.Dict)
		if !ok {
			return nil, invalidf("tools[%d] is not an object", i)
		}
		switch field(t, "type") {
		case "function":
			fn, err := functionTool(t, "")
			if err != nil {
				return nil, fmt.Errorf("tools[%d]: %w", i, err)
			}
			out = append(out, fn)
		case "namespace":
			ns, _ := field(t, "name").(string)
			inner, _ := field(t, "tools").([]any)
			for j, iv := range inner {
				it, ok := iv.(*chattemplate.Dict)
				if !ok || field(it, "type") != "function" {
					continue
				}
				fn, err := functionTool(it, ns)
				if err != nil {
					return nil, fmt.Errorf("tools[%d].tools[%d]: %w", i, j, err)
				}
				out = append(out, fn)
			}
		}
	}
	return out, nil
}

func functionTool(t *chattemplate.Dict, namespace string) (*chattemplate.Dict, error) {
	name, ok := field(t, "name").(string)
	if !ok {
		return nil, invalidf("name is not a string")
	}
	fn := chattemplate.NewDict()
	for _, k := range t.Keys() {
		if k != "type" {
			fn.Set(k, field(t, k))
		}
	}
	if namespace != "" {
		fn.Set("name", flatName(namespace, name))
	}
	return dict("type", "function", "function", fn), nil
}
