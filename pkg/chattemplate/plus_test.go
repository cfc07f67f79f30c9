package chattemplate

import (
	"errors"
	"strings"
	"testing"
)

// TestPlusChainOutputWrittenInPlace: {{ a + b + c }} written piece by piece
// renders and fails exactly as the joined value does ("| string" keeps the
// joined path).
func TestPlusChainOutputWrittenInPlace(t *testing.T) {
	vars := map[string]any{"a": "<|im_start|>", "b": "user", "c": strings.Repeat("x", 40), "n": 2, "l": []any{1}}
	tests := []struct {
		name, expr string
		opts       []Option
	}{
		{"strings", `a + b + "\n" + c`, nil},
		{"numbers", `n + n + n`, nil},
		{"lists", `l + l + l`, nil},
		{"mixed types fail", `a + b + n`, nil},
		{"undefined operand", `a + b + missing`, nil},
		{"output bound", `a + b + c`, []Option{WithMaxOutputBytes(30)}},
		{"built bound", `c + c + c`, []Option{WithMaxBuiltBytes(100)}},
		{"within bounds", `a + b + c`, []Option{WithMaxOutputBytes(80), WithMaxBuiltBytes(80)}},
	}
	render := func(src string, opts []Option) (string, error) {
		tmpl, err := Compile(src, opts...)
		if err != nil {
			return "", err
		}
		return tmpl.Render(vars)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, gotErr := render("{{ "+tc.expr+" }}|{{ "+tc.expr+" }}", tc.opts)
			want, wantErr := render("{{ ("+tc.expr+")|string }}|{{ ("+tc.expr+")|string }}", tc.opts)
			if got != want || (gotErr == nil) != (wantErr == nil) || errors.Is(gotErr, ErrLimit) != errors.Is(wantErr, ErrLimit) {
				t.Fatalf("in place %q, %v; joined %q, %v", got, gotErr, want, wantErr)
			}
		})
	}
}
