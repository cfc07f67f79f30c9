package usageaudit

import (
	"strings"
	"testing"
)

// BenchmarkCollector measures what reading a response costs the userspace
// leg: the payload of a 256-token SSE stream ending in its usage event,
// and a non-streamed JSON answer, fed in 32 KiB reads as the copy loop does
// (the proxy's de-framing is measured in its own package).
func BenchmarkCollector(b *testing.B) {
	stream := strings.Repeat("data: "+tokenEvent+"\n\n", 256) + "data: " + usageEvent + "\n\ndata: [DONE]\n\n"
	json := `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"` + strings.Repeat("word ", 400) +
		`","finish_reason":"length"}],` + usageEvent[len(`{"id":"c","choices":[],`):]
	for _, tc := range []struct {
		name string
		kind Kind
		wire string
	}{{"sse", KindEventStream, stream}, {"json", KindJSON, json}} {
		wire := []byte(tc.wire)
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(wire)))
			b.ReportAllocs()
			for b.Loop() {
				c := NewCollector(tc.kind, 0)
				for w := wire; len(w) > 0; {
					k := min(32<<10, len(w))
					c.Write(w[:k])
					w = w[k:]
				}
				if _, o := c.Usage(); o != Found {
					b.Fatalf("outcome %s", o)
				}
			}
		})
	}
}
