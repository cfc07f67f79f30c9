package chattemplate

import (
	"fmt"
	"strings"
	"testing"
)

// twentyTurnChat builds a 20-turn Qwen3 chat (system + 20 user turns + 19
// assistant turns with <think> blocks), the shape of a growing conversation.
func twentyTurnChat() []map[string]any {
	msgs := []map[string]any{{"role": "system", "content": "You are a helpful assistant."}}
	for i := 0; i < 20; i++ {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: what is %d squared, and why? Explain step by step.", i, i)})
		if i < 19 {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprintf("<think>\nCompute %d*%d.\n</think>\n\n%d squared is %d because multiplying %d by itself gives %d.", i, i, i, i*i, i, i*i)})
		}
	}
	return msgs
}

func BenchmarkRenderChatQwen3TwentyTurns(b *testing.B) {
	tmpl := compileNamed(b, "qwen3")
	in := ChatInput{Messages: twentyTurnChat(), AddGenerationPrompt: true,
		SpecialTokens: map[string]string{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}}
	out, err := tmpl.RenderChat(in)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.RenderChat(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRenderChatLlama3TwentyTurns(b *testing.B) {
	tmpl := compileNamed(b, "llama3")
	in := ChatInput{Messages: twentyTurnChat(), AddGenerationPrompt: true,
		SpecialTokens: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.RenderChat(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompileQwen3(b *testing.B) {
	src := loadTemplateSource(b, "qwen3")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderChatQwen3LongPrompt renders a RAG-style chat whose system
// prompt is ~128 KB (about 32k tokens), the size class of long prompts.
func BenchmarkRenderChatQwen3LongPrompt(b *testing.B) {
	tmpl := compileNamed(b, "qwen3")
	doc := strings.Repeat("The quick brown fox jumps over the lazy dog; 東京 🚀. ", 2400)
	in := ChatInput{Messages: []map[string]any{
		{"role": "system", "content": "Answer from the documents.\n" + doc},
		{"role": "user", "content": "Summarise the documents."},
	}, AddGenerationPrompt: true}
	out, err := tmpl.RenderChat(in)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.RenderChat(in); err != nil {
			b.Fatal(err)
		}
	}
}
