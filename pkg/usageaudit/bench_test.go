package usageaudit

import (
	"strings"
	"testing"
)

// BenchmarkCollector measures what reading a response costs the userspace
// leg: a 256-token chunked SSE stream ending in its usage event, and a
// non-streamed JSON answer, fed in 32 KiB reads as the copy loop does.
func BenchmarkCollector(b *testing.B) {
	var sse strings.Builder
	for range 256 {
		sse.WriteString(chunk("data: "+tokenEvent+"\n\n", 1<<20))
		sse.WriteString("\r\n")
	}
	stream := strings.ReplaceAll(sse.String(), "0\r\n\r\n\r\n", "")
	stream += chunk("data: "+usageEvent+"\n\ndata: [DONE]\n\n", 1<<20)
	json := `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"` + strings.Repeat("word ", 400) +
		`","finish_reason":"length"}],` + usageEvent[len(`{"id":"c","choices":[],`):]
	for _, tc := range []struct {
		name    string
		kind    Kind
		chunked bool
		wire    string
	}{{"sse-chunked", KindEventStream, true, stream}, {"json", KindJSON, false, json}} {
		wire := []byte(tc.wire)
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(wire)))
			b.ReportAllocs()
			for b.Loop() {
				c := NewCollector(tc.kind, tc.chunked, 0)
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
