package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

type chatExpected struct {
	Name     string   `json:"name"`
	Template string   `json:"template"`
	Render   string   `json:"render"`
	IDs      []uint32 `json:"ids"`
}

// loadChatRequests reads testdata/chat_cases.json (pkg/chattemplate's cases)
// into ChatRequests, keeping JSON key order as vLLM's Python would.
func loadChatRequests(t *testing.T) map[string]ChatRequest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "chat_cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	out := map[string]ChatRequest{}
	for _, c := range raw {
		var name string
		if err := json.Unmarshal(c["name"], &name); err != nil {
			t.Fatal(err)
		}
		msgs, err := chattemplate.DecodeMessages(c["messages"])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		req := ChatRequest{Messages: msgs}
		if v, ok := c["add_generation_prompt"]; ok {
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				t.Fatal(err)
			}
			req.AddGenerationPrompt = &b
		} else {
			f := false // the reference renders default to false when unset
			req.AddGenerationPrompt = &f
		}
		if v, ok := c["continue_final_message"]; ok {
			if err := json.Unmarshal(v, &req.ContinueFinalMessage); err != nil {
				t.Fatal(err)
			}
		}
		if v, ok := c["tools"]; ok && !isNull(v) {
			tv, err := chattemplate.DecodeJSON(v)
			if err != nil {
				t.Fatal(err)
			}
			var strict bool
			if s, ok := c["tools_strict_field"]; ok {
				_ = json.Unmarshal(s, &strict)
			}
			if req.Tools, err = chattemplate.VLLMToolDicts(tv.([]any), strict); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		if v, ok := c["documents"]; ok && !isNull(v) {
			dv, err := chattemplate.DecodeJSON(v)
			if err != nil {
				t.Fatal(err)
			}
			req.Documents = dv.([]any)
		}
		if v, ok := c["kwargs"]; ok && !isNull(v) {
			kv, err := chattemplate.DecodeJSON(v)
			if err != nil {
				t.Fatal(err)
			}
			d := kv.(*chattemplate.Dict)
			req.ChatTemplateKwargs = map[string]any{}
			for _, k := range d.Keys() {
				req.ChatTemplateKwargs[k], _ = d.Get(k)
			}
		}
		out[name] = req
	}
	return out
}

// TestEncodeChatMatchesReference: the model's own template from
// tokenizer_config.json renders exactly as Python Jinja2 did, and the render
// encodes (without special tokens) to HuggingFace's ids.
func TestEncodeChatMatchesReference(t *testing.T) {
	reqs := loadChatRequests(t)
	want := readJSONLines[chatExpected](t, filepath.Join("testdata", "chat_expected.jsonl"))
	if len(want) < 80 {
		t.Fatalf("only %d chat cases", len(want))
	}
	models := map[string]*Model{}
	for _, name := range []string{"qwen3", "llama3"} {
		m, err := NewModel(testTokenizer(t, name), mustConfig(t, name))
		if err != nil {
			t.Fatal(err)
		}
		models[name] = m
	}
	for _, w := range want {
		t.Run(w.Name, func(t *testing.T) {
			req, ok := reqs[w.Name]
			if !ok {
				t.Fatalf("no case %s", w.Name)
			}
			ids, rendered, err := models[w.Template].EncodeChat(req)
			if err != nil {
				t.Fatal(err)
			}
			if rendered != w.Render {
				t.Fatalf("render differs:\n got %q\nwant %q", rendered, w.Render)
			}
			if !slices.Equal(ids, w.IDs) {
				t.Fatalf("ids differ:\n got %v\nwant %v", ids, w.IDs)
			}
		})
	}
}

func TestEncodeChatDefaultsAndErrors(t *testing.T) {
	qwen, err := NewModel(testTokenizer(t, "qwen3"), mustConfig(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	// add_generation_prompt defaults to true, as in vLLM.
	_, rendered, err := qwen.EncodeChat(ChatRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"; rendered != want {
		t.Errorf("default render %q", rendered)
	}
	// Text parts are joined with "\n" (vLLM's "string" content format).
	parts := []map[string]any{{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "a"}, map[string]any{"type": "text", "text": "b"}}}}
	_, rendered, err = qwen.EncodeChat(ChatRequest{Messages: parts})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"; rendered != want {
		t.Errorf("parts render %q", rendered)
	}
	// A request template overrides the model's.
	_, rendered, err = qwen.EncodeChat(ChatRequest{Messages: msgs, ChatTemplate: "{{ messages[0].content }}!"})
	if err != nil || rendered != "hi!" {
		t.Errorf("override: %q %v", rendered, err)
	}
	// reasoning_effort "none" turns thinking off (Qwen3 writes an empty think
	// block), unless chat_template_kwargs says otherwise.
	_, off, err := qwen.EncodeChat(ChatRequest{Messages: msgs, ReasoningEffort: "none"})
	if err != nil || !strings.HasSuffix(off, "<think>\n\n</think>\n\n") {
		t.Errorf("reasoning_effort none: %q %v", off, err)
	}
	_, on, err := qwen.EncodeChat(ChatRequest{Messages: msgs, ReasoningEffort: "none", ChatTemplateKwargs: map[string]any{"enable_thinking": true}})
	if err != nil || strings.Contains(on, "<think>") {
		t.Errorf("kwargs override: %q %v", on, err)
	}
	noTmpl, err := NewModel(testTokenizer(t, "qwen3"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := noTmpl.EncodeChat(ChatRequest{Messages: msgs}); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("no template: %v", err)
	}
	if _, _, err := qwen.EncodeChat(ChatRequest{Messages: msgs, ChatTemplate: "{% if %}"}); err == nil {
		t.Error("bad template compiled")
	}
}
