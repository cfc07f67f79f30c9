package reqfacts

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

func boolp(b bool) *bool { return &b }

func TestExtract(t *testing.T) {
	long := strings.Repeat("the whole prompt is kept, never a prefix. ", 200)
	tests := []struct {
		name    string
		body    string
		header  string
		opts    Options
		want    Facts
		problem bool
		check   func(*testing.T, Facts)
	}{
		{
			name: "completion string",
			body: `{"model":"Qwen/Qwen3-0.6B","prompt":"hello world","stream":true}`,
			want: Facts{Kind: KindCompletion, Model: "Qwen/Qwen3-0.6B", Prompts: []Prompt{{Text: "hello world"}}, Stream: true, AddGenerationPrompt: true},
		},
		{
			name: "long prompt is not truncated",
			body: `{"model":"m","prompt":"` + long + `"}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Text: long}}, AddGenerationPrompt: true},
		},
		{
			name:   "X-Model header wins",
			body:   `{"model":"body-model","prompt":"x"}`,
			header: "header-model",
			want:   Facts{Kind: KindCompletion, Model: "header-model", ModelFromHeader: true, Prompts: []Prompt{{Text: "x"}}, AddGenerationPrompt: true},
		},
		{
			name: "list of strings",
			body: `{"model":"m","prompt":["a","b"]}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Text: "a"}, {Text: "b"}}, AddGenerationPrompt: true},
		},
		{
			name: "token ids",
			body: `{"model":"m","prompt":[1,2,4294967295]}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Tokens: []uint32{1, 2, 4294967295}, IsTokens: true}}, AddGenerationPrompt: true},
		},
		{
			name: "lists of token ids",
			body: `{"model":"m","prompt":[[1,2],[3]]}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Tokens: []uint32{1, 2}, IsTokens: true}, {Tokens: []uint32{3}, IsTokens: true}}, AddGenerationPrompt: true},
		},
		{
			name:    "negative token id drops the prompt",
			body:    `{"model":"m","prompt":[1,-2]}`,
			want:    Facts{Model: "m", AddGenerationPrompt: true},
			problem: true,
		},
		{
			name:    "token id above uint32",
			body:    `{"model":"m","prompt":[4294967296]}`,
			want:    Facts{Model: "m", AddGenerationPrompt: true},
			problem: true,
		},
		{
			name: "completion fields that change ids and hashes",
			body: `{"model":"m","prompt":"p","add_special_tokens":false,"truncate_prompt_tokens":7,"cache_salt":"tenant-a"}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Text: "p"}}, AddSpecialTokens: boolp(false), TruncatePromptTokens: 7, CacheSalt: "tenant-a", AddGenerationPrompt: true},
		},
		{
			name: "truncate -1 means no truncation",
			body: `{"model":"m","prompt":"p","truncate_prompt_tokens":-1}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Text: "p"}}, AddGenerationPrompt: true},
		},
		{
			name: "chat with string and parts content",
			body: `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":"bob"}]}`,
			want: Facts{Kind: KindChat, Model: "m", AddGenerationPrompt: true},
			check: func(t *testing.T, f Facts) {
				if len(f.Messages) != 2 || f.Messages[0]["role"] != "system" || f.Messages[0]["content"] != "sys" || f.Messages[1]["name"] != "bob" {
					t.Fatalf("messages %v", f.Messages)
				}
				if txt, ok := TextContent(f.Messages[1]["content"]); !ok || txt != "a\nb" {
					t.Fatalf("parts content %q %v", txt, ok)
				}
			},
		},
		{
			name: "chat template inputs",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"cache_salt":"s","chat_template":"{{ x }}"}`,
			want: Facts{Kind: KindChat, Model: "m", AddGenerationPrompt: false, ContinueFinalMessage: true,
				ChatTemplateKwargs: map[string]any{"enable_thinking": false}, AddSpecialTokens: boolp(true), CacheSalt: "s", ChatTemplate: "{{ x }}"},
			check: func(t *testing.T, f Facts) {
				if len(f.Tools) != 1 {
					t.Fatalf("tools %v", f.Tools)
				}
				fn, _ := f.Tools[0].(*chattemplate.Dict).Get("function")
				params, _ := fn.(*chattemplate.Dict).Get("parameters")
				if keys := params.(*chattemplate.Dict).Keys(); !reflect.DeepEqual(keys, []string{"z", "a"}) {
					t.Fatalf("tool schema key order %v, want request order [z a]", keys)
				}
			},
		},
		{
			name: "reasoning_effort sets enable_thinking",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"reasoning_effort":"none"}`,
			want: Facts{Kind: KindChat, Model: "m", AddGenerationPrompt: true,
				ChatTemplateKwargs: map[string]any{"enable_thinking": false}},
		},
		{
			name: "LoRA adapter named as the model",
			body: `{"model":"sql-lora","prompt":"x"}`,
			opts: Options{Adapters: []string{"other", "sql-lora"}},
			want: Facts{Kind: KindCompletion, Model: "sql-lora", LoRA: "sql-lora", Prompts: []Prompt{{Text: "x"}}, AddGenerationPrompt: true},
		},
		{
			name:    "non-JSON gives no model",
			body:    "model: m\nprompt: hello",
			want:    Facts{AddGenerationPrompt: true},
			problem: true,
		},
		{
			name:    "non-JSON ignores X-Model too",
			body:    "plain text",
			header:  "m",
			want:    Facts{AddGenerationPrompt: true},
			problem: true,
		},
		{
			name:    "JSON without prompt",
			body:    `{"model":"m"}`,
			want:    Facts{Model: "m", AddGenerationPrompt: true},
			problem: true,
		},
		{
			name:    "prompt without model",
			body:    `{"prompt":"x"}`,
			want:    Facts{Kind: KindCompletion, Prompts: []Prompt{{Text: "x"}}, AddGenerationPrompt: true},
			problem: true,
		},
		{
			name:    "message without role",
			body:    `{"model":"m","messages":[{"content":"x"}]}`,
			want:    Facts{Model: "m", AddGenerationPrompt: true},
			problem: true,
		},
		{
			name: "wrong-typed field does not hide the others",
			body: `{"model":"m","prompt":"x","stream":"yes","cache_salt":5,"add_special_tokens":"no"}`,
			want: Facts{Kind: KindCompletion, Model: "m", Prompts: []Prompt{{Text: "x"}}, AddGenerationPrompt: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Extract([]byte(tc.body), tc.header, tc.opts)
			if (got.Problem != "") != tc.problem {
				t.Fatalf("problem = %q, want problem: %v", got.Problem, tc.problem)
			}
			got.Problem = ""
			if tc.check != nil {
				tc.check(t, got)
			}
			got.Messages, got.Tools = nil, nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Extract =\n %#v\nwant\n %#v", got, tc.want)
			}
		})
	}
}

// rejectedPrompts are prompt values parsePrompt refuses (the bodies of the
// one-packet daemon crash, and their neighbours).
var rejectedPrompts = []string{`[]`, `""`, `5`, `true`, `{}`, `[-1]`, `[1.5]`, `[4294967296]`, `[[]]`, `["a",5]`, `[""]`, `[[-1]]`, `"\u0000"x`, `[[1],"a",[]]`, `[1e3]`, `null`}

// TestRejectedPromptHasNoKind: every body whose prompt or messages parsing
// rejects comes back KindUnknown with nothing to index, so no later stage can
// reach for Prompts[0] or Messages[0]. These bodies crashed the daemon
// (index out of range in the gateway's trie key) while the kind stayed
// "completion".
func TestRejectedPromptHasNoKind(t *testing.T) {
	for _, prompt := range rejectedPrompts {
		for _, shape := range []string{`{"model":"x","prompt":%s}`, `{"model":"x","messages":%s}`, `{"model":"x","messages":[{"role":"user","content":%s}]}`} {
			body := strings.Replace(shape, "%s", prompt, 1)
			t.Run(body, func(t *testing.T) {
				f := Extract([]byte(body), "", Options{})
				if f.Problem == "" && f.HasPrompt() {
					return // a valid body (a chat message whose content is a string)
				}
				if f.Kind != KindUnknown || len(f.Prompts) != 0 || len(f.Messages) != 0 || f.HasPrompt() {
					t.Fatalf("rejected body kept kind %v with %d prompts, %d messages (problem %q)", f.Kind, len(f.Prompts), len(f.Messages), f.Problem)
				}
				if _, ok := f.FirstPrompt(); ok {
					t.Fatal("FirstPrompt ok on a rejected body")
				}
			})
		}
	}
}

func TestSpecialTokensDefaults(t *testing.T) {
	c := Extract([]byte(`{"model":"m","prompt":"x"}`), "", Options{})
	ch := Extract([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`), "", Options{})
	if !c.SpecialTokens() || ch.SpecialTokens() {
		t.Fatalf("defaults: completion %v (want true), chat %v (want false)", c.SpecialTokens(), ch.SpecialTokens())
	}
}

func TestTextContent(t *testing.T) {
	tests := []struct {
		in   any
		want string
		ok   bool
	}{
		{"plain", "plain", true},
		{nil, "", true},
		{decode(`[{"type":"text","text":"a"},{"type":"text","text":"b"}]`), "a\nb", true},
		{decode(`[{"type":"image_url","image_url":{"url":"x"}}]`), "", false},
		{42.0, "", false},
	}
	for _, tc := range tests {
		got, ok := TextContent(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("TextContent(%v) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func decode(s string) any {
	v, err := chattemplate.DecodeJSON([]byte(s))
	if err != nil {
		panic(err)
	}
	return v
}

func TestTruncate(t *testing.T) {
	ids := []uint32{1, 2, 3, 4, 5}
	if got := Truncate(ids, 2); !reflect.DeepEqual(got, []uint32{4, 5}) {
		t.Fatalf("Truncate(2) = %v", got)
	}
	if got := Truncate(ids, 0); len(got) != 5 {
		t.Fatalf("Truncate(0) = %v", got)
	}
	if got := Truncate(ids, 9); len(got) != 5 {
		t.Fatalf("Truncate(9) = %v", got)
	}
}

func FuzzExtract(f *testing.F) {
	seeds := []string{
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","prompt":[[1,2],[3]],"truncate_prompt_tokens":1}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[],"chat_template_kwargs":{"x":1}}`,
		`{"messages":null,"prompt":null}`,
		`not json`,
		`{"model":"m","prompt":["a",[1]],"reasoning_effort":"low"}`,
		`[1,2,3]`,
	}
	for _, s := range seeds {
		f.Add([]byte(s), "")
	}
	for _, p := range rejectedPrompts {
		f.Add([]byte(`{"model":"x","prompt":`+p+`}`), "")
		f.Add([]byte(`{"model":"x","messages":`+p+`}`), "")
	}
	f.Add([]byte(`{"prompt":"x"}`), "hdr")
	f.Fuzz(func(t *testing.T, body []byte, header string) {
		got := Extract(body, header, Options{Adapters: []string{"m"}})
		if got.HasPrompt() && got.Kind == KindUnknown {
			t.Fatalf("prompt without a kind: %+v", got)
		}
		// The invariant the gateway indexes by: a kind always has its input.
		if got.Kind == KindCompletion && len(got.Prompts) == 0 || got.Kind == KindChat && len(got.Messages) == 0 {
			t.Fatalf("kind %v without its input: %+v", got.Kind, got)
		}
		for _, p := range got.Prompts {
			if !p.IsTokens && p.Text == "" {
				t.Fatalf("empty text prompt accepted")
			}
			if p.IsTokens && len(p.Tokens) == 0 {
				t.Fatalf("empty token prompt accepted")
			}
		}
		for _, m := range got.Messages {
			_, _ = TextContent(m["content"])
		}
	})
}

func BenchmarkExtractChat(b *testing.B) {
	sys := strings.Repeat("You are a careful assistant for an operations team. ", 150) // ~8 KB
	body := []byte(`{"model":"Qwen/Qwen3-0.6B","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"` + sys +
		`"},{"role":"user","content":[{"type":"text","text":"How do I drain a worker?"}]}],"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		if f := Extract(body, "", Options{}); !f.HasPrompt() {
			b.Fatal(f.Problem)
		}
	}
}

// FuzzParsePrompt: any JSON value as a prompt parses to prompts that are
// never empty, or to none with a reason; never a panic.
func FuzzParsePrompt(f *testing.F) {
	for _, p := range rejectedPrompts {
		f.Add([]byte(p))
	}
	for _, p := range []string{`"hello"`, `["a","b"]`, `[1,2,3]`, `[[1,2],[3]]`, `[4294967295]`, `[0]`, `["a",[1]]`} {
		f.Add([]byte(p))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		prompts, problem := parsePrompt(raw)
		if (len(prompts) == 0) == (problem == "") {
			t.Fatalf("prompts %v with problem %q: want exactly one of them", prompts, problem)
		}
		for i, p := range prompts {
			if p.IsTokens && len(p.Tokens) == 0 || !p.IsTokens && p.Text == "" {
				t.Fatalf("prompt %d is empty: %+v", i, p)
			}
		}
	})
}
