package chattemplate

import (
	"errors"
	"strings"
	"testing"
)

// AppendRenderChat writes RenderChat's text after dst's bytes, in one buffer
// a caller reuses across renders: each render must equal RenderChat's, keep
// dst's own bytes, come back unchanged on error, and a string taken from an
// earlier render (RenderChat's, which may share its array) must not change
// when the buffer is rendered into again.
func TestAppendRenderChatReusedBuffer(t *testing.T) {
	long := strings.Repeat("word ", 3000)
	setBlock := `{% for m in messages %}{% set c %}<{{ m.role }}>{{ m.content }}{% endset %}{{ c }}{% endfor %}`
	tests := []struct {
		name, src string
		in        ChatInput
		wantErr   bool
	}{
		{"plain", `{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}`,
			ChatInput{Messages: []map[string]any{{"role": "system", "content": long}, {"role": "user", "content": "hi"}}, AddGenerationPrompt: true}, false},
		{"set block and plus chain", setBlock + `{{ "a" + messages[0].role + "b" }}`,
			ChatInput{Messages: []map[string]any{{"role": "user", "content": long + "?"}}}, false},
		{"continue final message", `{% for m in messages %}[{{ m.role }}]{{ m.content }}[end]{% endfor %}`,
			ChatInput{Messages: []map[string]any{{"role": "user", "content": "q"}, {"role": "assistant", "content": "partial answer  "}}, ContinueFinalMessage: true}, false},
		{"short after long", `{{ messages[0].content }}`,
			ChatInput{Messages: []map[string]any{{"role": "user", "content": "tiny"}}}, false},
		{"raise_exception", `{{ raise_exception("no") }}`,
			ChatInput{Messages: []map[string]any{{"role": "user", "content": "x"}}}, true},
		{"both continue and generation prompt", `{{ messages[0].content }}`,
			ChatInput{Messages: []map[string]any{{"role": "user", "content": "x"}}, ContinueFinalMessage: true, AddGenerationPrompt: true}, true},
	}
	var buf []byte
	var earlier []string // RenderChat results, compared again after each render
	var earlierWant []string
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Compile(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := tmpl.RenderChat(tc.in)
			if (wantErr != nil) != tc.wantErr {
				t.Fatalf("RenderChat error %v, want error %v", wantErr, tc.wantErr)
			}
			for _, prefix := range []string{"", "kept>"} {
				buf = append(buf[:0], prefix...)
				dst := buf
				for i := len(dst); i < cap(dst); i++ {
					dst[:cap(dst)][i] = '#' // stale bytes of an earlier render
				}
				got, err := tmpl.AppendRenderChat(dst, tc.in)
				if tc.wantErr {
					var te *TemplateException
					if err == nil || (errors.As(wantErr, &te) != errors.As(err, &te)) || string(got) != prefix {
						t.Fatalf("prefix %q: got %q, %v; want dst back and RenderChat's error %v", prefix, got, err, wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != prefix+want {
					t.Fatalf("prefix %q: got %d bytes, want %d", prefix, len(got), len(prefix+want))
				}
				buf = got
			}
			if !tc.wantErr {
				earlier, earlierWant = append(earlier, want), append(earlierWant, strings.Clone(want))
			}
			for i := range earlier {
				if earlier[i] != earlierWant[i] {
					t.Fatalf("RenderChat result %d changed after a later render into a reused buffer", i)
				}
			}
		})
	}
}
