package usageaudit

import (
	"bytes"
	"testing"
)

// FuzzParseJSON: engine bytes never panic the parser, and what it accepts
// is in range.
func FuzzParseJSON(f *testing.F) {
	f.Add([]byte(usageEvent))
	f.Add([]byte(`{"usage":{"prompt_tokens":7,"prompt_tokens_details":null}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1e3}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		u, ok := ParseJSON(doc)
		if !ok {
			if u != (Usage{}) {
				t.Fatalf("rejected %q with %+v", doc, u)
			}
			return
		}
		if u.PromptTokens < 0 || u.PromptTokens > maxTokenCount || u.CachedTokens < 0 || u.CachedTokens > maxTokenCount {
			t.Fatalf("%q gave %+v", doc, u)
		}
	})
}

// FuzzCollector: any bytes, split anywhere, give the same answer as fed
// whole, and the collector keeps no more than its bound.
func FuzzCollector(f *testing.F) {
	f.Add([]byte("data: "+usageEvent+"\n\ndata: [DONE]\n\n"), uint8(3), true)
	f.Add([]byte("data: "+usageEvent+"\r\n\r\n"), uint8(1), true)
	f.Add([]byte(usageEvent), uint8(2), false)
	f.Fuzz(func(t *testing.T, wire []byte, split uint8, stream bool) {
		kind := KindJSON
		if stream {
			kind = KindEventStream
		}
		const bound = 512
		whole := NewCollector(kind, bound)
		whole.Write(bytes.Clone(wire))
		parts := NewCollector(kind, bound)
		step := int(split%16) + 1
		for w := wire; len(w) > 0; {
			k := min(step, len(w))
			parts.Write(bytes.Clone(w[:k]))
			w = w[k:]
			if cap(parts.body) > 2*bound+64 || cap(parts.line) > 2*bound+64 || cap(parts.last) > 2*bound+64 {
				t.Fatalf("collector holds %d/%d/%d bytes, bound %d", cap(parts.body), cap(parts.line), cap(parts.last), bound)
			}
		}
		u1, o1 := whole.Usage()
		u2, o2 := parts.Usage()
		if u1 != u2 || o1 != o2 {
			t.Fatalf("whole %+v %s, split by %d %+v %s", u1, o1, step, u2, o2)
		}
	})
}
