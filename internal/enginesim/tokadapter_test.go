package enginesim

import (
	"encoding/json"
	"slices"
	"testing"
)

// The real tokenizers are the tokenizer package's committed testdata (the
// Qwen3 and Llama-3 tokenizer.json + tokenizer_config.json).
const (
	qwen3Dir  = "../../pkg/tokenizer/testdata/qwen3"
	llama3Dir = "../../pkg/tokenizer/testdata/llama3"
)

func TestRealTokenizersTokenizeLikeVLLM(t *testing.T) {
	chat := []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}}
	tests := []struct {
		name      string
		dir       string
		bos       uint32 // BOS the chat template writes (0: none)
		chatStart string
	}{
		{"qwen3", qwen3Dir, 0, "<|im_start|>system\nBe brief.<|im_end|>\n"},
		{"llama3", llama3Dir, 128000, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := LoadTokenizer(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			// The adapter must not change pkg/tokenizer's ids (loading
			// the file twice doubles this test's time under -race).
			ref := tok.(*hfTokenizer).tok
			e := startEngine(t, Config{Tokenizer: tok})
			text := "The quick brown fox jumps over the lazy dog, again and again and again."

			// Completions: tokenizer.encode(text, add_special_tokens=True).
			var tk struct {
				Tokens []uint32 `json:"tokens"`
			}
			r := post(t, e.URL()+"/tokenize", map[string]any{"prompt": text})
			json.Unmarshal(r.body, &tk)
			want, _ := ref.Encode(text, true)
			if !slices.Equal(tk.Tokens, want) {
				t.Errorf("prompt ids %v, want %v", tk.Tokens, want)
			}
			// (This Llama-3 tokenizer.json has no TemplateProcessing
			// post-processor, so HF adds no BOS to completion strings either.)

			// Chat: template text, add_special_tokens=False, so exactly one BOS.
			ids, rendered, err := tok.EncodeChat(ChatRequest{Messages: mustJSON(t, chat), AddGenerationPrompt: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(rendered) < len(tc.chatStart) || rendered[:len(tc.chatStart)] != tc.chatStart {
				t.Errorf("rendered chat starts %q, want %q", rendered[:min(len(rendered), 80)], tc.chatStart)
			}
			want, _ = ref.Encode(rendered, false)
			if !slices.Equal(ids, want) {
				t.Errorf("chat ids differ from encode(rendered, add_special_tokens=False)")
			}
			if tc.bos != 0 && countOf(ids, tc.bos) != 1 {
				t.Errorf("chat prompt has %d BOS tokens, want 1", countOf(ids, tc.bos))
			}
			r = post(t, e.URL()+"/tokenize", map[string]any{"messages": chat})
			json.Unmarshal(r.body, &tk)
			if !slices.Equal(tk.Tokens, ids) {
				t.Errorf("/tokenize messages differs from EncodeChat")
			}

			// The chat request hits the cache on its second run and reads as text.
			body := map[string]any{"messages": chat, "max_tokens": 6}
			first := decodeCompletion(t, post(t, e.URL()+"/v1/chat/completions", body))
			second := decodeCompletion(t, post(t, e.URL()+"/v1/chat/completions", body))
			if first.Usage.PromptTokens != len(ids) || second.Usage.PromptTokensDetails.CachedTokens != (len(ids)-1)/16*16 {
				t.Errorf("usage %+v then %+v for %d prompt tokens", first.Usage, second.Usage, len(ids))
			}
			if first.Choices[0].Message.Content == "" || first.Choices[0].Message.Content != second.Choices[0].Message.Content {
				t.Errorf("synthetic output %q / %q", first.Choices[0].Message.Content, second.Choices[0].Message.Content)
			}
			// Out-of-vocabulary ids are rejected as vLLM does.
			if r := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": []int{1, 10_000_000}}); r.status != 400 {
				t.Errorf("out-of-vocabulary id: status %d", r.status)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func countOf(ids []uint32, id uint32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
