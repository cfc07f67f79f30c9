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

// TestEncodeRequestHead: the backend sees the client's end-to-end headers
// only, with framing kvgate wrote itself.
func TestEncodeRequestHead(t *testing.T) {
	hdr := []HeaderField{{"Host", "api"}, {"Connection", "keep-alive, X-Hop"}, {"X-Hop", "1"}, {"Keep-Alive", "5"},
		{"Content-Length", "9"}, {"Transfer-Encoding", "chunked"}, {"Expect", "100-continue"},
		{"X-Forwarded-For", "10.0.0.1"}, {"Accept-Encoding", "gzip"}, {"X-Request-Id", "client"}, {"Authorization", "Bearer k"}}
	for _, tt := range []struct {
		name     string
		o        Outgoing
		want     []string
		wantNot  []string
		endsWith string
	}{
		{name: "plain, inspected body",
			o:        Outgoing{Method: "POST", Target: "/v1/completions?x=1", Header: hdr, ClientAddr: "192.0.2.9:4000", ContentLength: 12},
			want:     []string{"POST /v1/completions?x=1 HTTP/1.1\r\n", "Host: api\r\n", "X-Forwarded-For: 10.0.0.1, 192.0.2.9\r\n", "Accept-Encoding: gzip\r\n", "Authorization: Bearer k\r\n"},
			wantNot:  []string{"X-Hop", "Keep-Alive", "Content-Length: 9", "Transfer-Encoding", "Expect"},
			endsWith: "Content-Length: 12\r\nConnection: close\r\n\r\n"},
		{name: "streamed chunked body",
			o:        Outgoing{Method: "POST", Target: "/", Header: hdr[:1], ClientAddr: "[::1]:5", Chunked: true},
			want:     []string{"X-Forwarded-For: ::1\r\n"},
			endsWith: "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"},
		{name: "P/D leg: dropped and set headers",
			o: Outgoing{Method: "POST", Target: "/", Header: hdr, ClientAddr: "192.0.2.9:4000", Drop: map[string]bool{"accept-encoding": true, "x-request-id": true},
				Set: []HeaderField{{"X-Request-Id", "kvgate"}}, ContentLength: 3},
			want:     []string{"X-Request-Id: kvgate\r\n"},
			wantNot:  []string{"Accept-Encoding", "X-Request-Id: client"},
			endsWith: "Content-Length: 3\r\nConnection: close\r\n\r\n"},
		{name: "no Host: the backend address",
			o:        Outgoing{Method: "GET", Target: "/", HostFallback: "10.1.1.1:8000", ClientAddr: "not-an-address"},
			want:     []string{"Host: 10.1.1.1:8000\r\n"},
			wantNot:  []string{"X-Forwarded-For"},
			endsWith: "Content-Length: 0\r\nConnection: close\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := string(EncodeRequestHead(tt.o))
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in\n%s", w, got)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(got, w) {
					t.Errorf("unexpected %q in\n%s", w, got)
				}
			}
			if !strings.HasSuffix(got, tt.endsWith) {
				t.Errorf("head does not end with %q:\n%s", tt.endsWith, got)
			}
		})
	}
}

// TestRelayedHead: the backend's framing is kept, its connection headers
// are replaced by the proxy's own, per client HTTP version.
func TestRelayedHead(t *testing.T) {
	rh := &ResponseHead{Status: 200, Reason: "OK", ContentLength: -1, Chunked: true,
		Header: []HeaderField{{"Transfer-Encoding", "chunked"}, {"Connection", "close, X-Hop"}, {"X-Hop", "1"}, {"Content-Type", "text/event-stream"}}}
	for _, tt := range []struct {
		minor    int
		decision string
		keep     bool
		want     string
	}{
		{1, "", true, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"},
		{0, "", true, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n\r\n"},
		{1, "tier=1.5; ep=0; score=1; reason=hit", false, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\nx-kvgate-decision: tier=1.5; ep=0; score=1; reason=hit\r\nConnection: close\r\n\r\n"},
	} {
		if got := string(RelayedHead(rh, tt.minor, tt.decision, tt.keep)); got != tt.want {
			t.Errorf("minor %d keep %v:\n got %q\nwant %q", tt.minor, tt.keep, got, tt.want)
		}
	}
}

// TestResponseHeadClose: whether the backend closes after a response
// decides whether a pooled connection can carry the next request.
func TestResponseHeadClose(t *testing.T) {
	cases := []struct {
		head string
		want bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", true},
		{"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n", true},
		{"HTTP/1.1 200 OK\r\nConnection: upgrade\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", true},
		{"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", true},
	}
	for _, c := range cases {
		h, err := ReadResponseHead(bufio.NewReader(strings.NewReader(c.head)), 1<<10)
		if err != nil {
			t.Fatalf("%q: %v", c.head, err)
		}
		if h.Close != c.want {
			t.Errorf("%q: Close %v, want %v", c.head, h.Close, c.want)
		}
	}
}

// TestEncodeRequestHeadKeepAlive: a pooled request leaves out
// Connection: close and still ends with the blank line.
func TestEncodeRequestHeadKeepAlive(t *testing.T) {
	for _, keep := range []bool{false, true} {
		head := string(EncodeRequestHead(Outgoing{Method: "GET", Target: "/", HostFallback: "h", KeepAlive: keep}))
		if strings.Contains(head, "Connection: close") == keep {
			t.Errorf("KeepAlive %v: head %q", keep, head)
		}
		if !strings.HasSuffix(head, "\r\n\r\n") || strings.Count(head, "\r\n\r\n") != 1 {
			t.Errorf("KeepAlive %v: head does not end once with the blank line: %q", keep, head)
		}
	}
}

// FuzzResponseHead: any backend bytes give a parsed head or an error,
// never a panic; a Connection header naming close always closes (a pooled
// connection must not outlive an engine that said it would close), and a
// chunked head declares no length.
func FuzzResponseHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: Keep-Alive , close\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadResponseHead(bufio.NewReaderSize(strings.NewReader(string(data)), 64), 4096)
		if err != nil {
			return
		}
		for _, hf := range h.Header {
			if strings.EqualFold(hf.Name, "connection") {
				for _, tok := range strings.Split(hf.Value, ",") {
					if strings.EqualFold(strings.TrimSpace(tok), "close") && !h.Close {
						t.Fatalf("Connection %q did not close", hf.Value)
					}
				}
			}
		}
		if h.Chunked && h.ContentLength != -1 {
			t.Fatalf("chunked with Content-Length %d", h.ContentLength)
		}
	})
}
