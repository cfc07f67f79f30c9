package chattemplate

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ChatInput is one chat request as vLLM hands it to apply_chat_template.
type ChatInput struct {
	// Messages are the request's messages (role, content, tool_calls, ...).
	// Use *Dict values (DecodeJSON) where key order reaches the output.
	Messages []map[string]any
	// Tools is the request's tools list; nil renders as None (no tools).
	Tools []any
	// Documents is the RAG documents list; nil renders as None.
	Documents []any
	// AddGenerationPrompt appends the assistant header. vLLM's default for
	// chat requests is true; the zero value here is false.
	AddGenerationPrompt bool
	// ContinueFinalMessage renders the last message open-ended, as
	// transformers does. It cannot be combined with AddGenerationPrompt.
	ContinueFinalMessage bool
	// Kwargs is the request's chat_template_kwargs (e.g. enable_thinking).
	// As in vLLM, the keys add_generation_prompt, continue_final_message,
	// tools and documents override the fields above.
	Kwargs map[string]any
	// SpecialTokens holds bos_token, eos_token, pad_token, unk_token (and any
	// other special_tokens_map entry) from tokenizer_config.json. Absent
	// keys stay undefined in the template, as with transformers.
	SpecialTokens map[string]string
	// Deadline, when set, stops the render with ErrLimit once passed (the
	// daemon's per-request time budget; docs/chat-templates.md, Bounds).
	Deadline time.Time
}

// ErrBadMessages reports messages vLLM would reject before rendering.
var ErrBadMessages = errors.New("chattemplate: invalid chat messages")

// RenderChat renders a chat the way vLLM's /v1/chat/completions does: it
// normalises the messages as vLLM's chat parser does (content parts, tool
// call arguments), then renders with transformers' variables.
func (t *Template) RenderChat(in ChatInput) (string, error) {
	out, err := t.AppendRenderChat(nil, in)
	if err != nil {
		return "", err
	}
	o := output{buf: out} // a new array nobody else holds: the string may share it
	return o.String(), nil
}

// AppendRenderChat is RenderChat appending the rendered text to dst (in its
// spare capacity when that is large enough) and returning the extended
// slice; on error dst comes back unchanged. A caller that renders long
// prompts can so reuse one buffer across requests (docs/tokenizer.md,
// "Decision cost at long context"); the template keeps nothing of it.
func (t *Template) AppendRenderChat(dst []byte, in ChatInput) ([]byte, error) {
	addGen, cont := in.AddGenerationPrompt, in.ContinueFinalMessage
	var tools, documents any
	if in.Tools != nil {
		tools = in.Tools
	}
	if in.Documents != nil {
		documents = in.Documents
	}
	root := newScope(nil)
	for k, v := range in.SpecialTokens {
		root.set(k, v)
	}
	for _, k := range sortedKeys(in.Kwargs) {
		v, err := toValue(in.Kwargs[k], 0)
		if err != nil {
			return dst, fmt.Errorf("chattemplate: chat_template_kwargs %q: %w", k, err)
		}
		switch k {
		case "chat_template", "tokenize":
			return dst, fmt.Errorf("%w: chat_template_kwargs must not contain %q", ErrBadMessages, k)
		case "messages", "conversation":
			return dst, fmt.Errorf("%w: chat_template_kwargs must not contain %q", ErrBadMessages, k)
		case "add_generation_prompt":
			addGen = isTruthy(v)
		case "continue_final_message":
			cont = isTruthy(v)
		case "tools":
			tools = v
		case "documents":
			documents = v
		default:
			root.set(k, v)
		}
	}
	if addGen && cont {
		return dst, fmt.Errorf("%w: continue_final_message and add_generation_prompt cannot both be true", ErrBadMessages)
	}
	msgs, err := t.normalizeMessages(in.Messages)
	if err != nil {
		return dst, err
	}
	if cont && len(msgs) == 0 {
		return dst, fmt.Errorf("%w: continue_final_message needs at least one message", ErrBadMessages)
	}
	if tools, err = toValue(tools, 0); err != nil {
		return dst, fmt.Errorf("chattemplate: tools: %w", err)
	}
	if documents, err = toValue(documents, 0); err != nil {
		return dst, fmt.Errorf("chattemplate: documents: %w", err)
	}
	root.set("messages", msgs)
	root.set("tools", tools)
	root.set("documents", documents)
	root.set("add_generation_prompt", addGen)
	n0 := len(dst)
	out, err := t.appendRender(dst, root, renderSizeHint(msgs, tools != nil || documents != nil), in.Deadline)
	if err != nil || !cont {
		return out, err
	}
	o := output{buf: out[n0:]}
	text, err := continueFinalMessage(o.String(), msgs[len(msgs)-1].(*Dict))
	if err != nil {
		return dst, err
	}
	return out[:n0+len(text)], nil // text is a prefix of the render
}

// renderSizeHint pre-sizes the rendered prompt. The common templates write
// each message's content once plus a few dozen bytes of markup, so the
// content plus a margin per message fits without a regrow and without
// allocating twice the prompt (a 400 KB render kept 800 KB alive in the
// tokenizer's conversation cache; docs/tokenizer.md, "Decision cost at long
// context"). Tools and documents are rendered as JSON of unknown size, so
// then the hint stays at twice the content. A wrong hint only costs a
// regrow: the output is the same.
func renderSizeHint(msgs []any, toolsOrDocuments bool) int {
	n := inputTextBytes(msgs)
	if toolsOrDocuments {
		return 1024 + 2*n
	}
	return 1024 + n + n/32 + 160*len(msgs)
}

// inputTextBytes sums the string content of the messages, to pre-size the
// output buffer.
func inputTextBytes(msgs []any) int {
	n := 0
	for _, m := range msgs {
		if s, ok := m.(*Dict).val("content").(string); ok {
			n += len(s)
		}
	}
	return n
}

// continueFinalMessage cuts the render after the final message's content,
// as transformers' render_jinja_template does for continue_final_message.
func continueFinalMessage(rendered string, last *Dict) (string, error) {
	final := last.val("content")
	if parts, ok := final.([]any); ok {
		final = nil
		for i := len(parts) - 1; i >= 0; i-- {
			if p, ok := parts[i].(*Dict); ok {
				if txt, ok := p.Get("text"); ok {
					final = txt
					break
				}
			}
		}
		if final == nil {
			return "", fmt.Errorf("%w: continue_final_message is set but the final message has no text to continue", ErrBadMessages)
		}
	}
	text, ok := final.(string)
	if !ok {
		return "", fmt.Errorf("%w: continue_final_message needs string content in the final message", ErrBadMessages)
	}
	stripped := strings.TrimFunc(text, pyIsSpace)
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the rendered chat", ErrBadMessages)
	}
	lstripped := strings.TrimLeftFunc(text, pyIsSpace)
	end := min(loc+len(lstripped), len(rendered))
	if rendered[loc:end] == text {
		return rendered[:end], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// textPartTypes are vLLM's text-like content part types and the key that
// holds their text.
var textPartTypes = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking",
}

// normalizeMessages mirrors vLLM's parse_chat_messages for text-only chats:
// content None becomes "" (string format) or [] (openai format), a string
// stays a string (string format) or becomes one text part, text parts are
// joined with "\n"; assistant tool_calls are kept, an empty list dropped,
// and string arguments JSON-decoded (invalid JSON becomes {}); "reasoning"
// is copied to reasoning and reasoning_content; tool messages keep
// tool_call_id and join all-text part lists; name and task are kept when
// strings. Other keys are dropped, as vLLM's ConversationMessage does.
func (t *Template) normalizeMessages(in []map[string]any) ([]any, error) {
	out := make([]any, 0, len(in))
	for i, raw := range in {
		msg, err := t.normalizeMessage(i, raw)
		if err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
	return out, nil
}

// normalizeMessage is normalizeMessages for message i.
func (t *Template) normalizeMessage(i int, raw map[string]any) (*Dict, error) {
	m, err := messageFields(raw)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: message %d: %w", i, err)
	}
	role, ok := m.val("role").(string)
	if !ok {
		return nil, fmt.Errorf("%w: message %d has no string role", ErrBadMessages, i)
	}
	content, err := t.normalizeContent(m.val("content"), role)
	if err != nil {
		return nil, fmt.Errorf("%w: message %d: %w", ErrBadMessages, i, err)
	}
	msg := NewDict()
	msg.Set("role", role)
	msg.Set("content", content)
	switch role {
	case "assistant":
		if err := assistantFields(msg, m); err != nil {
			return nil, fmt.Errorf("%w: message %d: %w", ErrBadMessages, i, err)
		}
	case "tool":
		if id, ok := m.Get("tool_call_id"); ok {
			msg.Set("tool_call_id", id)
		}
		if parts, ok := content.([]any); ok {
			msg.Set("content", joinToolParts(parts))
		}
	}
	if name, ok := m.val("name").(string); ok {
		msg.Set("name", name)
	}
	if task, ok := m.val("task").(string); ok {
		msg.Set("task", task)
	}
	if role == "developer" {
		msg.Set("tools", m.val("tools"))
	}
	return msg, nil
}

// assistantFields copies an assistant message's tool calls (normalized; an
// empty list dropped) and its reasoning from m onto msg.
func assistantFields(msg, m *Dict) error {
	if tc, ok := m.Get("tool_calls"); ok && tc != nil {
		calls, err := normalizeToolCalls(tc)
		if err != nil {
			return err
		}
		if calls != nil {
			msg.Set("tool_calls", calls)
		}
	}
	if reasoning, ok := m.Get("reasoning"); ok && reasoning != nil {
		msg.Set("reasoning", reasoning)
		msg.Set("reasoning_content", reasoning)
	}
	return nil
}

// messageFields converts the message keys vLLM reads (and only those).
func messageFields(raw map[string]any) (*Dict, error) {
	m := newDictCap(4)
	for _, k := range [...]string{"role", "content", "tool_calls", "reasoning", "tool_call_id", "name", "task", "tools"} {
		v, ok := raw[k]
		if !ok {
			continue
		}
		cv, err := toValue(v, 0)
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", k, err)
		}
		m.Set(k, cv)
	}
	return m, nil
}

func joinToolParts(parts []any) any {
	var texts []string
	for _, p := range parts {
		d, ok := p.(*Dict)
		if ok && d.val("type") != "text" {
			return parts
		}
		if ok {
			s, _ := d.val("text").(string)
			texts = append(texts, s)
		}
	}
	return strings.Join(texts, "\n")
}

func (t *Template) normalizeContent(c any, role string) (any, error) {
	openai := t.contentFormat == "openai"
	var parts []any
	switch x := c.(type) {
	case nil:
		parts = nil
	case string:
		if !openai {
			return x, nil
		}
		parts = []any{x}
	case []any:
		parts = x
	default:
		return nil, fmt.Errorf("content must be a string, a list of parts or null, not %s", typeName(c))
	}
	var texts []string
	wrapped := []any{}
	for _, p := range parts {
		var text string
		switch x := p.(type) {
		case string:
			text = x
		case *Dict:
			typ, _ := x.val("type").(string)
			key, ok := textPartTypes[typ]
			if !ok {
				if typ == "" {
					return nil, errors.New("missing 'type' field in content part")
				}
				return nil, fmt.Errorf("content part type %q is not supported for text-only rendering", typ)
			}
			v := x.val(key)
			if v == nil {
				if typ == "text" || typ == "refusal" {
					continue // vLLM skips these with a warning
				}
			}
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("content part %q must hold a string", typ)
			}
			text = s
		default:
			return nil, fmt.Errorf("content part must be a string or an object, not %s", typeName(p))
		}
		texts = append(texts, text)
		part := NewDict()
		part.Set("type", "text")
		part.Set("text", text)
		wrapped = append(wrapped, part)
	}
	if openai {
		return wrapped, nil
	}
	return strings.Join(texts, "\n"), nil
}

// normalizeToolCalls applies vLLM's _postprocess_messages to tool calls.
func normalizeToolCalls(v any) (any, error) {
	calls, ok := v.([]any)
	if !ok {
		return v, nil // vLLM leaves non-list tool_calls untouched
	}
	if len(calls) == 0 {
		return nil, nil
	}
	out := make([]any, len(calls))
	for i, c := range calls {
		call, ok := c.(*Dict)
		if !ok {
			return nil, fmt.Errorf("tool call %d is not an object", i)
		}
		fn, ok := call.val("function").(*Dict)
		if !ok {
			return nil, fmt.Errorf("tool call %d has no function object", i)
		}
		fn = fn.clone()
		switch args := fn.val("arguments").(type) {
		case string:
			parsed, err := DecodeJSON([]byte(args))
			if err != nil {
				parsed = NewDict()
			}
			fn.Set("arguments", parsed)
		case *Dict, []any:
		default:
			fn.Set("arguments", NewDict())
		}
		nc := call.clone()
		nc.Set("function", fn)
		out[i] = nc
	}
	return out, nil
}

// detectContentFormat follows vLLM's _detect_content_format: "openai" when
// the template loops over the content of a message taken from messages.
func detectContentFormat(body []node) string {
	var assigns []*setNode
	var loops []*forNode
	walkNodes(body, func(n node) {
		switch x := n.(type) {
		case *setNode:
			assigns = append(assigns, x)
		case *forNode:
			loops = append(loops, x)
		}
	})
	msgVars, ok := messageVars(assigns)
	if !ok {
		return "string" // vLLM's assertion fails; it falls back to the default
	}
	msgItems, ok := messageItems(loops, msgVars)
	if !ok {
		return "string"
	}
	for _, l := range loops {
		for _, v := range msgItems {
			if isVarOrElemsAccess(l.iter, v, "content") {
				return "openai"
			}
		}
	}
	return "string"
}

// messageVars is the names bound to messages (or slices or filters of it),
// transitively; false when one is bound to something other than a plain name.
func messageVars(assigns []*setNode) ([]string, bool) {
	msgVars := []string{"messages"}
	queue := []string{"messages"}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, a := range assigns {
			if !isVarOrElemsAccess(a.value, v, "") {
				continue
			}
			if a.target.name == "" || a.target.attr != "" || a.target.items != nil {
				return nil, false
			}
			msgVars = append(msgVars, a.target.name)
			if a.target.name != v {
				queue = append(queue, a.target.name)
			}
		}
	}
	return msgVars, true
}

// messageItems is the loop variables of the loops over any of msgVars; false
// when such a loop unpacks its items.
func messageItems(loops []*forNode, msgVars []string) ([]string, bool) {
	var msgItems []string
	for _, l := range loops {
		for _, v := range msgVars {
			if !isVarOrElemsAccess(l.iter, v, "") {
				continue
			}
			if l.target.name == "" || l.target.items != nil {
				return nil, false
			}
			msgItems = append(msgItems, l.target.name)
			break
		}
	}
	return msgItems, true
}

func isVarOrElemsAccess(e expr, name, key string) bool {
	switch x := e.(type) {
	case *filterExpr:
		return x.node != nil && isVarOrElemsAccess(x.node, name, key)
	case *testExpr:
		return isVarOrElemsAccess(x.node, name, key)
	case *getitemExpr:
		if _, ok := x.key.(*sliceExpr); ok {
			return isVarOrElemsAccess(x.obj, name, key)
		}
	}
	if key == "" {
		n, ok := e.(*nameExpr)
		return ok && n.name == name
	}
	switch x := e.(type) {
	case *getitemExpr:
		n, ok := x.obj.(*nameExpr)
		c, isConst := x.key.(*constExpr)
		return ok && n.name == name && isConst && c.v == key
	case *getattrExpr:
		n, ok := x.obj.(*nameExpr)
		return ok && n.name == name && x.attr == key
	}
	return false
}

func walkNodes(nodes []node, fn func(node)) {
	for _, n := range nodes {
		fn(n)
		switch x := n.(type) {
		case *ifNode:
			for _, b := range x.bodies {
				walkNodes(b, fn)
			}
			walkNodes(x.orElse, fn)
		case *forNode:
			walkNodes(x.body, fn)
			walkNodes(x.orElse, fn)
		case *setBlockNode:
			walkNodes(x.body, fn)
		case *macroNode:
			walkNodes(x.body, fn)
		case *callBlockNode:
			walkNodes(x.body, fn)
		case *filterBlockNode:
			walkNodes(x.body, fn)
		case *withNode:
			walkNodes(x.body, fn)
		}
	}
}

// DecodeMessages decodes a JSON array of chat messages, keeping the key
// order of nested objects (tool-call arguments, content parts) as Python's
// json module does.
func DecodeMessages(data []byte) ([]map[string]any, error) {
	v, err := DecodeJSON(data)
	if err != nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: messages must be a JSON array", ErrBadMessages)
	}
	out := make([]map[string]any, len(list))
	for i, item := range list {
		d, ok := item.(*Dict)
		if !ok {
			return nil, fmt.Errorf("%w: message %d is not an object", ErrBadMessages, i)
		}
		m := make(map[string]any, d.Len())
		for _, k := range d.keys {
			m[k] = d.val(k)
		}
		out[i] = m
	}
	return out, nil
}

// VLLMToolDicts reshapes request tools the way vLLM passes them to the
// template: pydantic's model_dump of ChatCompletionToolsParam, i.e.
// {"type", "function": {"name", "description", "parameters"[, "strict"]}}
// with absent optional fields as null, declared fields first and any extra
// fields after them in request order. withStrict selects vLLM releases whose
// FunctionDefinition has the "strict" field. tools should come from
// DecodeJSON so parameter schemas keep their key order.
func VLLMToolDicts(tools []any, withStrict bool) ([]any, error) {
	if tools == nil {
		return nil, nil
	}
	out := make([]any, len(tools))
	for i, raw := range tools {
		tv, err := toValue(raw, 0)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: tool %d: %w", i, err)
		}
		t, ok := tv.(*Dict)
		if !ok {
			return nil, fmt.Errorf("%w: tool %d is not an object", ErrBadMessages, i)
		}
		fn, ok := t.val("function").(*Dict)
		if !ok {
			return nil, fmt.Errorf("%w: tool %d has no function object", ErrBadMessages, i)
		}
		if _, ok := fn.val("name").(string); !ok {
			return nil, fmt.Errorf("%w: tool %d function has no name", ErrBadMessages, i)
		}
		f := NewDict()
		declared := []string{"name", "description", "parameters"}
		if withStrict {
			declared = append(declared, "strict")
		}
		for _, k := range declared {
			f.Set(k, fn.val(k))
		}
		for _, k := range fn.keys {
			if _, ok := f.Get(k); !ok {
				f.Set(k, fn.val(k))
			}
		}
		d := NewDict()
		typ, ok := t.Get("type")
		if !ok {
			typ = "function"
		}
		d.Set("type", typ)
		d.Set("function", f)
		for _, k := range t.keys {
			if _, ok := d.Get(k); !ok {
				d.Set(k, t.val(k))
			}
		}
		out[i] = d
	}
	return out, nil
}
