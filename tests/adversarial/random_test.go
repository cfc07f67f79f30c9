package adversarial

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
)

// randomBody draws an OpenAI-shaped request body: the fields kvgate reads,
// each present or not, each with a value of a random JSON type (often the
// right one, sometimes not), nested to a bounded depth. Sizes are bounded so
// 300 bodies stay well under a second of engine time.
func randomBody(rng *rand.Rand) (path string, body []byte) {
	chat := rng.IntN(2) == 0
	path = "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	m := map[string]any{}
	field := func(name string, right func() any) {
		switch rng.IntN(4) {
		case 0: // absent
		case 1:
			m[name] = randomValue(rng, 3)
		default:
			m[name] = right()
		}
	}
	field("model", func() any { return []string{model, "", " ", "x", model + "\x00"}[rng.IntN(5)] })
	if chat {
		field("messages", func() any { return randomMessages(rng) })
		field("tools", func() any {
			return []any{map[string]any{"type": "function", "function": map[string]any{"name": randomString(rng), "parameters": randomValue(rng, 3)}}}
		})
		field("chat_template", func() any { return randomTemplate(rng) })
		field("chat_template_kwargs", func() any {
			return map[string]any{"enable_thinking": rng.IntN(2) == 0, randomString(rng): randomValue(rng, 2)}
		})
		field("add_generation_prompt", func() any { return rng.IntN(2) == 0 })
		field("continue_final_message", func() any { return rng.IntN(2) == 0 })
		field("documents", func() any { return []any{map[string]any{"title": randomString(rng), "text": randomString(rng)}} })
		field("reasoning_effort", func() any { return []string{"none", "low", "high", ""}[rng.IntN(4)] })
	} else {
		field("prompt", func() any { return randomPrompt(rng) })
	}
	field("add_special_tokens", func() any { return rng.IntN(2) == 0 })
	field("truncate_prompt_tokens", func() any { return rng.IntN(40) - 2 })
	field("cache_salt", func() any { return randomString(rng) })
	field("stream", func() any { return rng.IntN(2) == 0 })
	field("user", func() any { return randomString(rng) })
	m["max_tokens"] = 1
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	if rng.IntN(20) == 0 && len(b) > 2 { // now and then, cut the body short
		b = b[:rng.IntN(len(b))]
	}
	return path, b
}

var atoms = []string{"", "a", " ", "\n", "é", "日本", "🙂", "<|im_start|>", "<|endoftext|>", "{{", "{%", "\u0000", "\\", "\"", "'s", "123", "\u2028"}

func randomString(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(12) {
		a := atoms[rng.IntN(len(atoms))]
		b.WriteString(strings.Repeat(a, 1+rng.IntN(8)))
	}
	return b.String()
}

func randomValue(rng *rand.Rand, depth int) any {
	k := rng.IntN(8)
	if depth <= 0 {
		k %= 5
	}
	switch k {
	case 0:
		return nil
	case 1:
		return rng.IntN(2) == 0
	case 2:
		return []any{-1, 0, 1.5, 4294967296, 1e300, 7}[rng.IntN(6)]
	case 3, 4:
		return randomString(rng)
	case 5, 6:
		out := make([]any, rng.IntN(5))
		for i := range out {
			out[i] = randomValue(rng, depth-1)
		}
		return out
	default:
		out := map[string]any{}
		for range rng.IntN(4) {
			out[[]string{"role", "content", "type", "text", "name", randomString(rng)}[rng.IntN(6)]] = randomValue(rng, depth-1)
		}
		return out
	}
}

func randomPrompt(rng *rand.Rand) any {
	switch rng.IntN(4) {
	case 0:
		return randomString(rng)
	case 1:
		out := make([]any, 1+rng.IntN(4))
		for i := range out {
			out[i] = randomString(rng)
		}
		return out
	case 2:
		out := make([]int, rng.IntN(64))
		for i := range out {
			out[i] = rng.IntN(160000)
		}
		return out
	default:
		return []any{[]int{1, 2, 3}, randomValue(rng, 1)}
	}
}

func randomMessages(rng *rand.Rand) any {
	out := make([]any, rng.IntN(5))
	for i := range out {
		msg := map[string]any{"role": []string{"system", "user", "assistant", "tool", "", "x"}[rng.IntN(6)]}
		switch rng.IntN(4) {
		case 0:
			msg["content"] = randomString(rng)
		case 1:
			msg["content"] = []any{map[string]any{"type": "text", "text": randomString(rng)}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "x"}}}
		case 2:
			msg["content"] = randomValue(rng, 2)
		}
		if rng.IntN(5) == 0 {
			msg["tool_calls"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "arguments": randomValue(rng, 2)}}}
		}
		out[i] = msg
	}
	return out
}

// randomTemplate mixes ordinary chat-template fragments with costly ones.
func randomTemplate(rng *rand.Rand) string {
	parts := []string{
		"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
		"{{ messages|tojson }}", "{{ raise_exception('no') }}", "{{ (['x'] * 100000)|length }}",
		"{% set ns = namespace(s='ab') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
		"{{ undefined_var.x }}", "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "{{ 'a' * 9999999999 }}",
		"{% for i in range(100000) %}{{ i }}{% endfor %}", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "{{",
	}
	var b strings.Builder
	for range 1 + rng.IntN(3) {
		b.WriteString(parts[rng.IntN(len(parts))])
	}
	return b.String()
}
