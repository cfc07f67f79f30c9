package datapath

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// endAfter is a BodyEnd for tests: the body is its first n bytes; a byte
// equal to bad (when set) breaks its framing; broken is what a broken body
// ends with.
type endAfter struct {
	n       int
	bad     byte
	broken  []byte
	seen    int
	skipped bool
	err     error
}

var errTestFraming = errors.New("test framing broke")

func (e *endAfter) Feed(p []byte) int {
	if e.err != nil || e.skipped {
		return 0
	}
	take := min(len(p), e.n-e.seen)
	if e.bad != 0 {
		if i := bytes.IndexByte(p[:take], e.bad); i >= 0 {
			take, e.err = i, errTestFraming
		}
	}
	e.seen += take
	return take
}

func (e *endAfter) Skip(n int64, _ []byte, _ bool) { e.seen += int(n); e.skipped = true }

func (e *endAfter) State() BodyState {
	return BodyState{Complete: e.seen >= e.n, Delimited: true, Seen: int64(e.seen), Err: e.err}
}

func (e *endAfter) BrokenEnd(string) []byte {
	if e.seen >= e.n {
		return nil
	}
	return e.broken
}

// TestUserspaceFollowsBodyEnd: the userspace leg ends where Options.End
// says the body ends, writes nothing past it, takes a backend close before
// it or broken framing as BackendBroken, and then writes the end's broken-
// body bytes; without an End the body ends when the backend closes.
func TestUserspaceFollowsBodyEnd(t *testing.T) {
	cases := []struct {
		name      string
		end       *endAfter // nil: Options.End left nil
		prefix    string
		sent      string // by the backend after the prefix
		close     bool   // the backend closes after sent
		want      string // what the client receives
		ending    Ending
		eventSent bool
	}{
		{"complete, bytes past the end", &endAfter{n: 8}, "abc", "defghXYZ", false, "abcdefgh", BackendEOF, false},
		{"complete within the prefix", &endAfter{n: 2}, "abc", "", false, "ab", BackendEOF, false},
		{"empty body", &endAfter{n: 0}, "", "", false, "", BackendEOF, false},
		{"backend closed before the end", &endAfter{n: 100, broken: []byte("<end>")}, "ab", "cd", true, "abcd<end>", BackendBroken, true},
		{"broken framing", &endAfter{n: 100, bad: '!'}, "ab", "cd!ef", false, "abcd", BackendBroken, false},
		{"until the backend closes", nil, "ab", "cdef", true, "abcdef", BackendEOF, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clientFar, client := tcpPair(t)
			backend, backendFar := tcpPair(t)
			go func() {
				_, _ = io.WriteString(backendFar, tc.sent)
				if tc.close {
					backendFar.Close()
				}
			}()
			opts := Options{ContentLength: -1, Silence: 30 * time.Second}
			if tc.end != nil {
				opts.End = tc.end
			}
			done := make(chan Result, 1)
			go func() { done <- NewUserspace(0).Run(context.Background(), client, backend, []byte(tc.prefix), opts) }()
			var r Result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the leg did not end")
			}
			client.Close()
			got, _ := io.ReadAll(clientFar)
			if string(got) != tc.want || r.Ending != tc.ending || r.ErrorEvent != tc.eventSent {
				t.Fatalf("client got %q, ending %v (%v), error event %v; want %q, %v, %v", got, r.Ending, r.Err, r.ErrorEvent, tc.want, tc.ending, tc.eventSent)
			}
			if want := int64(len(tc.want)); tc.eventSent {
				if r.Bytes != want-int64(len(tc.end.broken)) {
					t.Fatalf("bytes %d, want the body without the broken end", r.Bytes)
				}
			} else if r.Bytes != want {
				t.Fatalf("bytes %d, want %d", r.Bytes, want)
			}
		})
	}
}
