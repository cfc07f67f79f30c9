package http1

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func FuzzParseHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: keep-alive, X-A\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST / HTTP/1.0\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"\r\nGET / HTTP/1.1\nHost: y\n\n",
		"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(strings.NewReader(string(data)), 64)
		head, err := ReadHead(br, 4096)
		if err != nil {
			return
		}
		req, err := ParseRequestHead(head)
		if err != nil {
			var he *Error
			if !errors.As(err, &he) || he.Status < 400 {
				t.Fatalf("parse error is not an HTTP refusal: %v", err)
			}
			return
		}
		if req.Chunked && req.ContentLength >= 0 {
			t.Fatalf("both chunked and Content-Length accepted")
		}
		if req.ContentLength < -1 {
			t.Fatalf("negative Content-Length %d", req.ContentLength)
		}
		if req.Chunked {
			cr := NewChunkedReader(br)
			_, _ = io.Copy(io.Discard, &LimitedBody{R: cr, N: 1 << 16})
		}
	})
}

func BenchmarkParseHead(b *testing.B) {
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.example:8080\r\nUser-Agent: OpenAI/JS 5.23.2\r\n" +
		"Content-Type: application/json\r\nAccept: application/json\r\nAuthorization: Bearer sk-xxxxxxxxxxxxxxxx\r\n" +
		"X-Stainless-Lang: js\r\nX-Stainless-Retry-Count: 0\r\nContent-Length: 1234\r\nConnection: keep-alive\r\n\r\n"
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for i := 0; i < b.N; i++ {
		br := bufio.NewReader(strings.NewReader(raw))
		head, err := ReadHead(br, 64<<10)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ParseRequestHead(head); err != nil {
			b.Fatal(err)
		}
	}
}
