package chattemplate

import (
	"strings"
	"testing"
)

// TestRenderChatPastSizeHint: the output is the same whether the rendered
// prompt fits renderSizeHint or outgrows it (the hint only sizes a buffer).
func TestRenderChatPastSizeHint(t *testing.T) {
	long := strings.Repeat("word ", 4000)
	msgs := []map[string]any{{"role": "system", "content": long}, {"role": "user", "content": "hi"}}
	tests := []struct {
		name, src string
		tools     []any
		want      string
	}{
		{"content once (within the hint)", `{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}`, nil,
			"[system]" + long + "[user]hi"},
		{"content three times (past the hint)", `{% for m in messages %}{{ m.content }}{{ m.content }}{{ m.content }}{% endfor %}`, nil,
			long + long + long + "hihihi"},
		{"markup far over the margin", `{% for m in messages %}{{ "x" * 5000 }}{% endfor %}`, nil,
			strings.Repeat("x", 10000)},
		{"tools", `{{ tools | length }}{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}`, []any{map[string]any{"type": "function"}},
			"1" + long + long + "hihi"},
		{"empty output", `{% if false %}x{% endif %}`, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Compile(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.RenderChat(ChatInput{Messages: msgs, Tools: tc.tools})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %d bytes, want %d", len(got), len(tc.want))
			}
		})
	}
}
