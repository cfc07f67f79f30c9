package reqfacts

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// Conversation is a /v1/responses or /v1/messages request turned into the
// chat request vLLM renders for it: the same messages, tools and template
// flags vLLM's conversion hands to its chat template (docs/tokenizer.md,
// "Responses and Messages APIs"). kvgate routes by it and enginesim serves
// by it, so both compute the same token ids from one conversion.
type Conversation struct {
	// Messages are OpenAI chat messages whose values are chattemplate's
	// decoded types (*chattemplate.Dict objects keep their key order).
	Messages []map[string]any
	// Tools are chat-completions tool objects ({"type":"function",
	// "function":{…}}) before chattemplate.VLLMToolDicts; nil without tools.
	Tools []any
	// AddGenerationPrompt and ContinueFinalMessage are the template flags.
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// ChatTemplateKwargs are the extra template variables; nil when none.
	ChatTemplateKwargs map[string]any
	// CacheSalt salts the first block (Responses API only: vLLM's Anthropic
	// request model has no cache_salt field and drops it).
	CacheSalt string
}

// ErrInvalidRequest marks a body vLLM would reject before rendering; the
// error text names the field.
var ErrInvalidRequest = errors.New("invalid request")

// ErrMultimodal marks a request holding an image or file: vLLM turns it into
// placeholder tokens and multimodal hashes a router cannot reproduce.
var ErrMultimodal = errors.New("the request holds an image or file")

// ErrUnpredictable marks a request vLLM accepts but renders with a value
// kvgate cannot know (a generated tool-call id, Python's repr of a list).
var ErrUnpredictable = errors.New("vLLM renders a value kvgate cannot predict")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// decodeObject decodes a request body as an ordered JSON object, with the
// one-pass reader: it gives exactly DecodeJSON's values (key order, int64
// and float64 numbers, U+FFFD for invalid UTF-8; TestJSONReaderMatchesDecodeJSON)
// at a fraction of encoding/json's token-by-token cost on a long
// conversation (docs/tokenizer.md, "Decision cost at long context").
func decodeObject(raw []byte) (*chattemplate.Dict, error) {
	r := chattemplate.NewJSONReader(raw)
	v, err := r.Value(0)
	if err == nil {
		err = r.End()
	}
	if err != nil {
		return nil, invalidf("body is not valid JSON: %v", err)
	}
	d, ok := v.(*chattemplate.Dict)
	if !ok {
		return nil, invalidf("body is not a JSON object")
	}
	return d, nil
}

// field returns d[key], nil when absent.
func field(d *chattemplate.Dict, key string) any {
	v, _ := d.Get(key)
	return v
}

// optString reads an optional string field: absent and null are "", ok;
// another type is not ok.
func optString(d *chattemplate.Dict, key string) (string, bool) {
	switch v := field(d, key).(type) {
	case nil:
		return "", true
	case string:
		return v, true
	}
	return "", false
}

func dict(pairs ...any) *chattemplate.Dict {
	d := chattemplate.NewDict()
	for i := 0; i+1 < len(pairs); i += 2 {
		d.Set(pairs[i].(string), pairs[i+1])
	}
	return d
}

// toMessages turns built messages into the map form Facts and the chat
// renderer take.
func toMessages(ds []*chattemplate.Dict) []map[string]any {
	out := make([]map[string]any, len(ds))
	for i, d := range ds {
		m := make(map[string]any, d.Len())
		for _, k := range d.Keys() {
			m[k], _ = d.Get(k)
		}
		out[i] = m
	}
	return out
}

// templateKwargs reads chat_template_kwargs (an object, or absent/null).
func templateKwargs(top *chattemplate.Dict) (map[string]any, error) {
	switch v := field(top, "chat_template_kwargs").(type) {
	case nil:
		return nil, nil
	case *chattemplate.Dict:
		if v.Len() == 0 {
			return nil, nil
		}
		out := make(map[string]any, v.Len())
		for _, k := range v.Keys() {
			out[k], _ = v.Get(k)
		}
		return out, nil
	}
	return nil, invalidf("chat_template_kwargs is not an object")
}

// withEffort applies a reasoning effort the way kvgate's chat path does
// (docs/tokenizer.md, "Special tokens"): enable_thinking = effort != "none"
// unless the kwargs set it.
func withEffort(kwargs map[string]any, effort string) map[string]any {
	if effort == "" {
		return kwargs
	}
	if _, set := kwargs["enable_thinking"]; set {
		return kwargs
	}
	if kwargs == nil {
		kwargs = map[string]any{}
	}
	kwargs["enable_thinking"] = effort != "none"
	return kwargs
}

// multimodalPartTypes are content part types that carry media.
var multimodalPartTypes = map[string]bool{
	"image": true, "image_url": true, "input_image": true, "input_file": true, "input_audio": true,
	"audio_url": true, "video_url": true, "file": true,
}

// checkParts rejects a content list holding media parts.
func checkParts(content any) error {
	parts, ok := content.([]any)
	if !ok {
		return nil
	}
	for _, p := range parts {
		d, ok := p.(*chattemplate.Dict)
		if !ok {
			continue
		}
		if typ, _ := field(d, "type").(string); multimodalPartTypes[typ] {
			return fmt.Errorf("%w: a %q content part", ErrMultimodal, typ)
		}
	}
	return nil
}

// flatName joins a namespace and a tool name as vLLM's
// flat_namespace_tool_name does.
func flatName(namespace, name string) string {
	return namespace + "__" + name
}

// concat is Python's "".join: the parts with no separator.
func concat(parts []string) string { return strings.Join(parts, "") }
