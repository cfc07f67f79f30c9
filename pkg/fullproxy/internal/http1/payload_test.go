package http1

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// chunkBody frames s as a chunked body with chunks of at most n bytes.
func chunkBody(s string, n int) string {
	var b strings.Builder
	for len(s) > 0 {
		k := min(n, len(s))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", k, s[:k])
		s = s[k:]
	}
	b.WriteString("0\r\n\r\n")
	return b.String()
}

func TestPayload(t *testing.T) {
	const doc = `{"usage":{"prompt_tokens":33,"prompt_tokens_details":{"cached_tokens":16}}}`
	sse := "data: {\"x\":1}\n\ndata: " + doc + "\n\ndata: [DONE]\n\n"
	tests := []struct {
		name    string
		chunked bool
		length  int64
		wire    string
		want    string
		bad     bool
	}{
		{"identity until close", false, -1, doc, doc, false},
		{"content length stops at the body's end", false, int64(len(doc)), doc + "next response", doc, false},
		{"chunked", true, -1, chunkBody(doc, 7), doc, false},
		{"chunked event stream", true, -1, chunkBody(sse, 5), sse, false},
		{"chunk extension", true, -1, "5;x=y\r\n" + doc[:5] + "\r\n" + chunkBody(doc[5:], 100), doc, false},
		{"trailers are not payload", true, -1, chunkBody(doc, 50)[:len(chunkBody(doc, 50))-2] + "X-T: 1\r\n\r\n", doc, false},
		{"bytes after the last chunk ignored", true, -1, chunkBody(doc, 50) + "garbage", doc, false},
		{"bad chunk size", true, -1, "zz\r\n" + doc, "", true},
		{"chunk data without CRLF", true, -1, "2\r\n{}xx", "{}", true},
	}
	for _, tc := range tests {
		for _, split := range []int{1, 3, 1 << 20} {
			t.Run(fmt.Sprintf("%s/split%d", tc.name, split), func(t *testing.T) {
				var got strings.Builder
				p := NewPayload(tc.chunked, tc.length, func(b []byte) { got.Write(b) })
				for w := tc.wire; len(w) > 0; {
					k := min(split, len(w))
					p.Write([]byte(w[:k]))
					w = w[k:]
				}
				if got.String() != tc.want {
					t.Errorf("payload %q, want %q", got.String(), tc.want)
				}
				if bad := errors.Is(p.Err(), ErrBadFraming); bad != tc.bad {
					t.Errorf("framing error %v, want bad=%v", p.Err(), tc.bad)
				}
			})
		}
	}
}

// BenchmarkPayload measures removing the chunked framing of a stream of 256
// chunks of 64 bytes (about a token event each) for the usage audit, fed in
// 32 KiB reads as the copy loop does.
func BenchmarkPayload(b *testing.B) {
	var wire strings.Builder
	for range 256 {
		fmt.Fprintf(&wire, "%x\r\n%s\r\n", 64, strings.Repeat("x", 64))
	}
	wire.WriteString("0\r\n\r\n")
	w := []byte(wire.String())
	b.SetBytes(int64(len(w)))
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		p := NewPayload(true, -1, func(b []byte) { n += len(b) })
		for rest := w; len(rest) > 0; {
			k := min(32<<10, len(rest))
			p.Write(rest[:k])
			rest = rest[k:]
		}
		if n != 256*64 {
			b.Fatalf("payload %d bytes", n)
		}
	}
}
