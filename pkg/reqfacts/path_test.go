package reqfacts

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

func TestKindFromPath(t *testing.T) {
	tests := []struct {
		path string
		want Kind
	}{
		{"/v1/chat/completions", KindChat},
		{"/v1/completions", KindCompletion},
		{"/v1/responses", KindResponses},
		{"/v1/messages", KindMessages},
		{"/v1/messages/count_tokens", KindUnknown},
		{"/v1/embeddings", KindUnknown},
		{"/v1/chat/completions/", KindUnknown}, // vLLM's routes are exact
		{"/V1/messages", KindUnknown},
		{"/tokenize", KindUnknown},
		{"/", KindUnknown},
		{"", KindUnknown},
	}
	for _, tc := range tests {
		if got := KindFromPath(tc.path); got != tc.want {
			t.Errorf("KindFromPath(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// TestExtractPath: the path, not the body's shape, decides how a body is
// read. Before, an Anthropic body was read as OpenAI chat and its system
// prompt dropped.
func TestExtractPath(t *testing.T) {
	anthropic := `{"model":"claude-like","max_tokens":16,"system":"You are a KV router.","messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name   string
		path   string
		body   string
		check  func(*testing.T, Facts)
		kind   Kind
		notAPI bool
		skip   string
	}{
		{name: "anthropic body keeps its system prompt", path: "/v1/messages", body: anthropic, kind: KindMessages,
			check: func(t *testing.T, f Facts) {
				if len(f.Messages) != 2 || f.Messages[0]["role"] != "system" || f.Messages[0]["content"] != "You are a KV router." {
					t.Fatalf("messages %v, want the system prompt first", f.Messages)
				}
				if f.SpecialTokens() || !f.AddGenerationPrompt {
					t.Errorf("chat defaults: special tokens %v, add_generation_prompt %v", f.SpecialTokens(), f.AddGenerationPrompt)
				}
			}},
		{name: "anthropic body on the chat path is chat", path: "/v1/chat/completions", body: anthropic, kind: KindChat,
			check: func(t *testing.T, f Facts) {
				if len(f.Messages) != 1 {
					t.Fatalf("chat reads messages only, got %v", f.Messages)
				}
			}},
		{name: "messages ignores cache_salt and chat_template", path: "/v1/messages",
			body: `{"model":"m","max_tokens":1,"cache_salt":"s","chat_template":"x","add_special_tokens":true,"truncate_prompt_tokens":3,"messages":[{"role":"user","content":"hi"}]}`,
			kind: KindMessages, check: func(t *testing.T, f Facts) {
				if f.CacheSalt != "" || f.ChatTemplate != "" || f.AddSpecialTokens != nil || f.TruncatePromptTokens != 0 {
					t.Fatalf("fields vLLM's Anthropic model drops were read: %+v", f)
				}
			}},
		{name: "messages chat_template_kwargs and effort", path: "/v1/messages",
			body: `{"model":"m","max_tokens":1,"chat_template_kwargs":{"x":1},"output_config":{"effort":"low"},"messages":[{"role":"user","content":"hi"}]}`,
			kind: KindMessages, check: func(t *testing.T, f Facts) {
				if f.ChatTemplateKwargs["x"] != int64(1) || f.ChatTemplateKwargs["enable_thinking"] != true {
					t.Fatalf("kwargs %v", f.ChatTemplateKwargs)
				}
			}},
		{name: "responses string input", path: "/v1/responses", body: `{"model":"m","input":"hello","instructions":"sys","cache_salt":"salt","stream":true,"user":"u1"}`, kind: KindResponses,
			check: func(t *testing.T, f Facts) {
				if len(f.Messages) != 2 || f.CacheSalt != "salt" || !f.Stream || f.User != "u1" {
					t.Fatalf("facts %+v", f)
				}
			}},
		{name: "responses reasoning effort", path: "/v1/responses", body: `{"model":"m","input":"hello","reasoning":{"effort":"none"}}`, kind: KindResponses,
			check: func(t *testing.T, f Facts) {
				if f.ChatTemplateKwargs["reasoning_effort"] != "none" || f.ChatTemplateKwargs["enable_thinking"] != false {
					t.Fatalf("kwargs %v", f.ChatTemplateKwargs)
				}
			}},
		{name: "chat body on the completions path has no prompt", path: "/v1/completions", body: `{"model":"m","messages":[{"role":"user","content":"x"}]}`, kind: KindUnknown},
		{name: "completion body on the chat path has no messages", path: "/v1/chat/completions", body: `{"model":"m","prompt":"x"}`, kind: KindUnknown},
		{name: "body with both on the completions path is a completion", path: "/v1/completions", body: `{"model":"m","prompt":"p","messages":[{"role":"user","content":"x"}]}`, kind: KindCompletion},
		{name: "embeddings are not prompt-bearing", path: "/v1/embeddings", body: `{"model":"m","prompt":"x"}`, kind: KindUnknown, notAPI: true,
			check: func(t *testing.T, f Facts) {
				if f.Model != "m" {
					t.Fatalf("model %q, want it read for the fallback", f.Model)
				}
			}},
		{name: "image block", path: "/v1/messages", body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x"}}]}]}`, kind: KindUnknown, skip: "multimodal"},
		{name: "tool_use without id", path: "/v1/messages", body: `{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f"}]}]}`, kind: KindUnknown, skip: "unpredictable"},
		{name: "responses input_image", path: "/v1/responses", body: `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:"}]}]}`, kind: KindUnknown, skip: "multimodal"},
		{name: "responses without input", path: "/v1/responses", body: `{"model":"m"}`, kind: KindUnknown},
		{name: "X-Model wins on messages", path: "/v1/messages", body: `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, kind: KindMessages},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := ExtractPath(tc.path, []byte(tc.body), "", Options{})
			if tc.name == "X-Model wins on messages" {
				f = ExtractPath(tc.path, []byte(tc.body), "hdr", Options{})
				if f.Model != "hdr" {
					t.Fatalf("model %q", f.Model)
				}
			}
			if f.Kind != tc.kind || f.NotPromptPath != tc.notAPI || f.Unsupported != tc.skip {
				t.Fatalf("kind %v notPromptPath %v unsupported %q (problem %q), want %v %v %q", f.Kind, f.NotPromptPath, f.Unsupported, f.Problem, tc.kind, tc.notAPI, tc.skip)
			}
			if f.HasPrompt() != (tc.kind != KindUnknown) {
				t.Fatalf("HasPrompt %v for kind %v", f.HasPrompt(), f.Kind)
			}
			if tc.kind == KindUnknown && f.Problem == "" {
				t.Fatal("no problem recorded")
			}
			if tc.check != nil {
				tc.check(t, f)
			}
		})
	}
}

// FuzzConvertMessages: any body either converts or fails with one of the
// package's errors; never a panic, and a conversion always has messages.
func FuzzConvertMessages(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]},{"role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"tool_use","id":"i","name":"n","input":{"a":[1,2.5,"é"]}}]}],"tools":[{"name":"n","input_schema":{"properties":{}}}]}`,
		`{"messages":[{"role":"system","content":""}]}`,
		`{"messages":[{"role":"assistant","content":[{"type":"tool_result","content":"x"}]}]}`,
		`[]`, `{"messages":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkConversion(t, body, ConvertMessages)
	})
}

// FuzzConvertResponses: as FuzzConvertMessages for the Responses API.
func FuzzConvertResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","instructions":"i","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"reasoning","content":[{"text":"r"}]},{"type":"function_call","call_id":"c","name":"n","arguments":"{}","namespace":"ns"},{"type":"function_call_output","call_id":"c","output":"o"},{"role":"assistant","content":"x","status":"incomplete"}],"tools":[{"type":"function","name":"n"},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"m"}]}],"reasoning":{"effort":"low"}}`,
		`{"input":"x"}`, `{"input":[{"type":"x"}]}`, `{"input":[[]]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkConversion(t, body, ConvertResponses)
	})
}

func checkConversion(t *testing.T, body []byte, convert func([]byte) (*Conversation, error)) {
	checkDecodeObject(t, body)
	conv, err := convert(body)
	if err != nil {
		if conv != nil {
			t.Fatal("a conversion with an error")
		}
		return
	}
	if len(conv.Messages) == 0 {
		// A Messages body whose only message is a tool-result-only user
		// message converts to nothing but tool messages; a list always
		// holds at least one message otherwise.
		t.Fatalf("conversion without messages for %q", body)
	}
	if conv.AddGenerationPrompt == conv.ContinueFinalMessage {
		t.Fatalf("add_generation_prompt and continue_final_message both %v", conv.AddGenerationPrompt)
	}
	for _, m := range conv.Messages {
		if _, ok := m["role"].(string); !ok {
			t.Fatalf("message without a role: %v", m)
		}
	}
}

// checkDecodeObject: the one-pass reader behind /v1/responses and
// /v1/messages refuses what encoding/json refuses (DecodeJSON let trailing
// garbage such as "{}A0" through) and decodes the rest to what
// chattemplate.DecodeJSON gives, so every conversion is the one
// DecodeJSON's values gave.
func checkDecodeObject(t *testing.T, body []byte) {
	t.Helper()
	got, gotErr := decodeObject(body)
	if !json.Valid(body) {
		if gotErr == nil {
			t.Fatalf("decodeObject(%.80q) accepted invalid JSON", body)
		}
		return
	}
	v, wantErr := chattemplate.DecodeJSON(body)
	want, isObject := v.(*chattemplate.Dict)
	if wantErr == nil && !isObject {
		if gotErr == nil {
			t.Fatalf("decodeObject(%.80q) accepted a non-object", body)
		}
		return
	}
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("decodeObject(%.80q) error %v, DecodeJSON error %v", body, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeObject(%.80q) = %#v, DecodeJSON = %#v", body, got, want)
	}
}

// TestDecodeObjectMatchesDecodeJSON: Messages and Responses bodies with
// escapes, invalid UTF-8, repeated keys, number forms and deep nesting.
func TestDecodeObjectMatchesDecodeJSON(t *testing.T) {
	tests := []struct{ name, body string }{
		{"messages with tool input", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"i","name":"n","input":{"b":[1,2.5,-0,1e3,12345678901234567890],"a":null}}]}]}`},
		{"responses input list", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a\u00e9\ud83d\ude42"}]}],"reasoning":{"effort":"low"}}`},
		{"repeated key", `{"model":"a","input":"x","model":"b"}`},
		{"invalid UTF-8 and lone surrogate", "{\"input\":\"a\xffb\\ud83dx\"}"},
		{"whitespace around", " \n{\"input\" : \"x\" }\t"},
		{"nesting at the bound", `{"input":` + strings.Repeat("[", 99) + strings.Repeat("]", 99) + `}`},
		{"nesting far past the bound", `{"input":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`},
		{"not an object", `["input"]`},
		{"trailing data", `{"input":"x"} {}`},
		{"trailing garbage DecodeJSON let through", `{}A0`},
		{"truncated", `{"input":"x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkDecodeObject(t, []byte(tc.body)) })
	}
}

// BenchmarkExtractMessagesLong: a ~400 KB /v1/messages body (a long
// conversation), validated and decoded for conversion.
func BenchmarkExtractMessagesLong(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","max_tokens":64,"stream":true,"messages":[`)
	for i := 0; sb.Len() < 400<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		sb.WriteString(`{"role":"` + role + `","content":[{"type":"text","text":"`)
		sb.WriteString(strings.Repeat("the routing kernel cache block token \u00e9 ", 200))
		sb.WriteString(`"}]}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if f := ExtractPath("/v1/messages", body, "", Options{}); f.Problem != "" {
			b.Fatal(f.Problem)
		}
	}
}
