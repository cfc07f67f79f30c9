package fullproxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

func TestTraceID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", ""},
		{"", ""},
	}
	for _, tc := range tests {
		if got := traceID(tc.in); got != tc.want {
			t.Errorf("traceID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestTraceContextPassesThrough: W3C traceparent and tracestate reach the
// engine byte for byte, and the access log records the trace id, so a slow
// request can be followed across kvgate and the engine's own traces.
func TestTraceContextPassesThrough(t *testing.T) {
	be := startBackend(t, "ep0", nil)
	var logs syncbuf.Buffer
	s := startProxy(t, Config{Handler: NewForward(&staticRouter{addrs: []string{be.addr}}, nil),
		AccessLog: slog.New(slog.NewJSONHandler(&logs, nil))})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	resp, body := rawExchange(t, s.Addr().String(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\ntraceparent: "+parent+
		"\r\ntracestate: "+state+"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	got := be.last(t)
	if got.header.Get("traceparent") != parent || got.header.Get("tracestate") != state {
		t.Fatalf("engine saw traceparent %q tracestate %q", got.header.Get("traceparent"), got.header.Get("tracestate"))
	}
	waitFor := func() map[string]any {
		for range 200 {
			for _, line := range bytes.Split([]byte(logs.String()), []byte("\n")) {
				var m map[string]any
				if json.Unmarshal(line, &m) == nil && m["msg"] == "request" {
					return m
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no access-log line:\n%s", logs.String())
		return nil
	}
	if rec := waitFor(); rec["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("access log trace_id = %v in %v", rec["trace_id"], strings.TrimSpace(logs.String()))
	}
}
