package chattemplate

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// hostileTemplates each try to make one render allocate or print far more
// than the render bounds allow. Shared with FuzzHostileTemplate as seeds.
var hostileTemplates = []struct {
	name, src string
}{
	// 231 bytes that built a 4M-element list (~400 MB) while checkSize
	// compared the element count with the byte bound.
	{"list doubling", `{% set ns = namespace(a=["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]) %}{% for i in range(22) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ ns.a|length }}`},
	{"tuple doubling", `{% set ns = namespace(a=("xxxxxxxxxxxxxxxx",)) %}{% for i in range(24) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ ns.a|length }}`},
	{"list repeat", `{{ (["x" * 1000] * 100000)|length }}`},
	{"nested sharing printed", `{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}`},
	{"nested sharing to JSON", `{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a|tojson }}`},
	{"replace amplification", `{{ ("a" * 1000000).replace("a", "b" * 1000) }}`},
	{"string doubling", `{% set ns = namespace(s="x") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}`},
	{"rebuilding a large value in a loop", `{% for i in range(100000) %}{% set x = "y" * (4000000 + i) %}{% endfor %}`},
	{"ljust width", `{{ "x".ljust(100000000) }}`},
	{"join amplification", `{{ ("x" * 1000000).join(["a"] * 100) }}`},
}

// TestHostileTemplatesHitLimits: every hostile template fails with ErrLimit
// under the default bounds instead of running away.
func TestHostileTemplatesHitLimits(t *testing.T) {
	for _, tc := range hostileTemplates {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Compile(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			out, err := tmpl.Render(nil)
			if !errors.Is(err, ErrLimit) {
				t.Fatalf("render gave %d bytes, err %v: want ErrLimit", len(out), err)
			}
		})
	}
}

// TestByteBoundKeepsOrdinaryLists: lists well within the byte bound still
// build (the bound counts bytes, and ordinary templates stay far below it).
func TestByteBoundKeepsOrdinaryLists(t *testing.T) {
	tmpl, err := Compile(`{% set ns = namespace(a=[]) %}{% for m in messages %}{% set ns.a = ns.a + [m.content] %}{% endfor %}{{ ns.a|join("|")|length }} {{ (["ab"] * 1000)|join|length }}`)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]any, 500)
	for i := range msgs {
		msgs[i] = map[string]any{"role": "user", "content": strings.Repeat("c", 1000)}
	}
	out, err := tmpl.Render(map[string]any{"messages": msgs})
	if err != nil || out != "500499 2000" {
		t.Fatalf("render = %q, %v", out, err)
	}
}

// FuzzHostileTemplate mutates the hostile templates: under tight bounds no
// render may panic, exceed the output bound, or run away (the fuzzer's own
// per-input timeout catches a hang).
func FuzzHostileTemplate(f *testing.F) {
	for _, tc := range hostileTemplates {
		f.Add(tc.src)
	}
	vars := map[string]any{"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("hi ", 100)}}}
	const maxOut = 1 << 16
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src, WithMaxSteps(50000), WithMaxOutputBytes(maxOut), WithMaxBuiltBytes(4<<20))
		if err != nil {
			return
		}
		out, err := tmpl.Render(vars)
		if err == nil && len(out) > maxOut {
			t.Fatalf("output of %d bytes exceeds the bound", len(out))
		}
	})
}

// TestRenderDeadline: RenderChat stops once ChatInput.Deadline has passed
// (checked every deadlineEvery steps), and renders normally without one.
func TestRenderDeadline(t *testing.T) {
	tmpl, err := Compile(`{% for i in range(50000) %}{% endfor %}{{ messages[0].content }}`)
	if err != nil {
		t.Fatal(err)
	}
	in := ChatInput{Messages: []map[string]any{{"role": "user", "content": "hi"}}}
	if out, err := tmpl.RenderChat(in); err != nil || out != "hi" {
		t.Fatalf("no deadline: %q, %v", out, err)
	}
	in.Deadline = time.Now().Add(-time.Second)
	if _, err := tmpl.RenderChat(in); !errors.Is(err, ErrLimit) {
		t.Fatalf("past deadline: %v, want ErrLimit", err)
	}
}
