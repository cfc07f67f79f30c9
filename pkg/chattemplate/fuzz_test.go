package chattemplate

import (
	"testing"
	"time"
)

// FuzzCompileRender feeds arbitrary template sources through the lexer,
// parser and evaluator: no input may panic or run unbounded.
func FuzzCompileRender(f *testing.F) {
	for _, name := range []string{"qwen3", "llama3"} {
		f.Add(loadTemplateSource(f, name))
	}
	for _, seed := range []string{
		"", "{{ x }}", "{% for m in messages %}{{ m.role }}{% endfor %}", "{%- if a -%}b{%+ else %}c{% endif +%}",
		"{# c #}{% raw %}{{{% endraw %}", "{{ 'a\\u00e9\\x41' ~ 1.5e3 ~ 0x1F }}", "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}",
		"{{ messages[::-1] | map(attribute='role') | join(',') }}", "{% macro m(a, b=2) %}{{ caller() }}{% endmacro %}{% call m(1) %}x{% endcall %}",
		"{{ {'a': [1, (2,)]} | tojson(indent=2) }}", "{% for i in range(3) recursive %}{{ loop(range(i)) }}{% endfor %}",
		"{{ '%s %d' % ('a', 1) }}{{ '{}'.format(1) }}", "{{ x if y else z }}{{ a is not none and b is divisibleby 3 }}",
	} {
		f.Add(seed)
	}
	vars := map[string]any{
		"messages": []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "<think>x</think>y"}},
		"x":        1, "y": "s", "tools": []any{map[string]any{"type": "function"}},
	}
	clock := WithClock(func() time.Time { return fixedNow })
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src, clock, WithMaxSteps(20000), WithMaxOutputBytes(1<<16))
		if err != nil {
			return
		}
		out, err := tmpl.Render(vars)
		if err == nil && len(out) > 1<<16 {
			t.Fatalf("output of %d bytes exceeds the bound", len(out))
		}
	})
}

// FuzzDecodeJSON checks the ordered JSON decoder never panics.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,2.5,"x",null,true,{"b":[]}]`, `12345678901234567890`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := DecodeJSON(data)
		if err != nil {
			return
		}
		if _, err := pyJSONDumps(v, jsonOptions{itemSep: ", ", keySep: ": "}); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}
