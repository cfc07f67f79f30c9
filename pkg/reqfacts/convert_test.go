package reqfacts

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// vector is one conversion: a request body and the chat messages and tools
// vLLM converts it into.
type vector struct {
	Name     string          `json:"name"`
	Body     json.RawMessage `json:"body"`
	Messages json.RawMessage `json:"messages"`
	Tools    json.RawMessage `json:"tools"`
	// ContinueFinal is the continue_final_message flag (Responses only).
	ContinueFinal bool `json:"continue_final_message"`
	// Source cites the vLLM lines a hand-derived vector follows.
	Source string `json:"source"`
}

func loadVectors(t *testing.T, name string) []vector {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(data, &vs); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(vs) == 0 {
		t.Fatalf("%s holds no vectors", name)
	}
	return vs
}

// encode is the JSON of a decoded value with its key order kept.
func encode(t *testing.T, v any) string {
	t.Helper()
	b, err := chattemplate.MarshalJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sameMessages compares converted messages with the expected JSON: the same
// keys per message (their order does not reach the template, which reads a
// normalised copy) and each value equal with nested key order kept.
func sameMessages(t *testing.T, got []map[string]any, want json.RawMessage) {
	t.Helper()
	wantV, err := chattemplate.DecodeJSON(want)
	if err != nil {
		t.Fatal(err)
	}
	wantList, _ := wantV.([]any)
	if len(got) != len(wantList) {
		t.Fatalf("%d messages, want %d:\ngot  %v\nwant %s", len(got), len(wantList), got, want)
	}
	for i, w := range wantList {
		wd := w.(*chattemplate.Dict)
		keys := make([]string, 0, len(got[i]))
		for k := range got[i] {
			keys = append(keys, k)
		}
		wantKeys := wd.Keys()
		slices.Sort(keys)
		slices.Sort(wantKeys)
		if !slices.Equal(keys, wantKeys) {
			t.Fatalf("message %d keys %v, want %v", i, keys, wantKeys)
		}
		for _, k := range wantKeys {
			wv, _ := wd.Get(k)
			if g, w := encode(t, got[i][k]), encode(t, wv); g != w {
				t.Errorf("message %d %q:\ngot  %s\nwant %s", i, k, g, w)
			}
		}
	}
}

func sameTools(t *testing.T, got []any, want json.RawMessage) {
	t.Helper()
	wantV, err := chattemplate.DecodeJSON(want)
	if err != nil {
		t.Fatal(err)
	}
	if wantV == nil {
		if got != nil {
			t.Fatalf("tools %s, want none", encode(t, got))
		}
		return
	}
	if g, w := encode(t, got), encode(t, wantV); g != w {
		t.Errorf("tools:\ngot  %s\nwant %s", g, w)
	}
}

// TestConvertMessagesVectors checks the Anthropic conversion against
// vectors produced by running vLLM's own conversion code
// (testdata/gen_anthropic_vectors.py; docs/tokenizer.md names the commits).
func TestConvertMessagesVectors(t *testing.T) {
	for _, v := range loadVectors(t, "anthropic_vectors.json") {
		t.Run(v.Name, func(t *testing.T) {
			conv, err := ConvertMessages(v.Body)
			if err != nil {
				t.Fatal(err)
			}
			sameMessages(t, conv.Messages, v.Messages)
			sameTools(t, conv.Tools, v.Tools)
			if !conv.AddGenerationPrompt || conv.ContinueFinalMessage {
				t.Errorf("template flags %v/%v, want vLLM's chat defaults true/false", conv.AddGenerationPrompt, conv.ContinueFinalMessage)
			}
		})
	}
}

// TestConvertResponsesVectors checks the Responses conversion against
// hand-derived vectors, each citing the vLLM lines it follows: vLLM's
// conversion needs the openai Python package's types, which this machine
// cannot install (docs/tokenizer.md).
func TestConvertResponsesVectors(t *testing.T) {
	for _, v := range loadVectors(t, "responses_vectors.json") {
		t.Run(v.Name, func(t *testing.T) {
			if v.Source == "" {
				t.Fatal("a hand-derived vector must cite the vLLM lines it follows")
			}
			conv, err := ConvertResponses(v.Body)
			if err != nil {
				t.Fatal(err)
			}
			sameMessages(t, conv.Messages, v.Messages)
			dumped, err := chattemplate.VLLMToolDicts(conv.Tools, true)
			if err != nil {
				t.Fatal(err)
			}
			sameTools(t, dumped, v.Tools)
			if conv.ContinueFinalMessage != v.ContinueFinal || conv.AddGenerationPrompt == v.ContinueFinal {
				t.Errorf("continue_final_message %v add_generation_prompt %v, want %v/%v", conv.ContinueFinalMessage, conv.AddGenerationPrompt, v.ContinueFinal, !v.ContinueFinal)
			}
		})
	}
}

func TestConvertErrors(t *testing.T) {
	tests := []struct {
		name    string
		convert func([]byte) (*Conversation, error)
		body    string
		want    error
	}{
		{"messages: image block", ConvertMessages, `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}`, ErrMultimodal},
		{"messages: image in a tool result", ConvertMessages, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"u"}}]}]}]}`, ErrMultimodal},
		{"messages: tool_use without id", ConvertMessages, `{"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`, ErrUnpredictable},
		{"messages: assistant tool result with blocks", ConvertMessages, `{"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`, ErrUnpredictable},
		{"messages: unknown block type", ConvertMessages, `{"messages":[{"role":"user","content":[{"type":"video"}]}]}`, ErrInvalidRequest},
		{"messages: bad role", ConvertMessages, `{"messages":[{"role":"tool","content":"x"}]}`, ErrInvalidRequest},
		{"messages: empty", ConvertMessages, `{"messages":[]}`, ErrInvalidRequest},
		{"messages: not a list", ConvertMessages, `{"messages":"hi"}`, ErrInvalidRequest},
		{"messages: numeric content", ConvertMessages, `{"messages":[{"role":"user","content":5}]}`, ErrInvalidRequest},
		{"messages: text not a string", ConvertMessages, `{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, ErrInvalidRequest},
		{"messages: system a number", ConvertMessages, `{"system":1,"messages":[{"role":"user","content":"x"}]}`, ErrInvalidRequest},
		{"messages: tool without schema", ConvertMessages, `{"tools":[{"name":"f"}],"messages":[{"role":"user","content":"x"}]}`, ErrInvalidRequest},
		{"messages: not JSON", ConvertMessages, `{"messages":`, ErrInvalidRequest},
		{"responses: input_image part", ConvertResponses, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`, ErrMultimodal},
		{"responses: input_file part", ConvertResponses, `{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_file","file_id":"f"}]}]}`, ErrMultimodal},
		{"responses: no input", ConvertResponses, `{"model":"m"}`, ErrInvalidRequest},
		{"responses: empty input list", ConvertResponses, `{"input":[]}`, ErrInvalidRequest},
		{"responses: function_call without call_id", ConvertResponses, `{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, ErrInvalidRequest},
		{"responses: unknown item", ConvertResponses, `{"input":[{"type":"web_search_call","id":"w"}]}`, ErrInvalidRequest},
		{"responses: instructions a number", ConvertResponses, `{"instructions":3,"input":"x"}`, ErrInvalidRequest},
		{"responses: tools not a list", ConvertResponses, `{"input":"x","tools":{}}`, ErrInvalidRequest},
		{"responses: top level array", ConvertResponses, `[1]`, ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.convert([]byte(tc.body))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}
