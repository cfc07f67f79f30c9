package datapath

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"
)

// TestUserspaceTap: a tapped leg shows the tap exactly the bytes the client
// got, prefix included, and nothing past the body's end.
func TestUserspaceTap(t *testing.T) {
	body := "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
	tests := []struct {
		name   string
		prefix string
		rest   string
	}{
		{"all from the connection", "", body},
		{"prefix then connection", body[:9], body[9:]},
		{"all in the prefix", body, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clientFar, client := tcpPair(t)
			backend, backendFar := tcpPair(t)
			go func() { _, _ = io.WriteString(backendFar, tc.rest+"NEXT RESPONSE") }()
			var tapped bytes.Buffer
			res := NewUserspace(4).Run(context.Background(), client, backend, []byte(tc.prefix),
				Options{Silence: 5 * time.Second, End: &endAfter{n: len(body)}, ContentLength: -1, Tap: func(p []byte) { tapped.Write(p) }})
			if res.Ending != BackendEOF {
				t.Fatalf("ending %s (%v)", res.Ending, res.Err)
			}
			got := make([]byte, len(body))
			if _, err := io.ReadFull(clientFar, got); err != nil {
				t.Fatal(err)
			}
			if tapped.String() != body || string(got) != body {
				t.Errorf("tap saw %q, client got %q; want %q", tapped.String(), got, body)
			}
		})
	}
}
