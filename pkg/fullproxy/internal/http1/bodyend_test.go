package http1

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
	"regexp"
	"testing"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// sseChunks is two SSE events, one chunk each.
var sseChunks = chunkOf(`data: {"i":0,"t":"ab"}`+"\n\n") + chunkOf(`data: {"i":1,"t":"cd"}`+"\n\n")

func chunkOf(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// TestFraming: complete, cut and malformed bodies, fed whole and one byte
// at a time, with bytes past the end left out.
func TestFraming(t *testing.T) {
	cases := []struct {
		name     string
		chunked  bool
		length   int64
		in       string
		accepted int // bytes that belong to the body
		complete bool
		boundary bool // at an SSE event boundary
		bad      bool
	}{
		{"chunked complete", true, -1, sseChunks + "0\r\n\r\n", len(sseChunks) + 5, true, false, false},
		{"chunked complete, bytes after the end", true, -1, sseChunks + "0\r\n\r\nHTTP/1.1 200", len(sseChunks) + 5, true, false, false},
		{"chunked with trailers and extensions", true, -1, "3;x=1\r\nabc\r\n0;y\r\nA: b\r\nC: d\r\n\r\n", 31, true, false, false},
		{"uppercase hex and leading zeros", true, -1, "0A\r\n0123456789\r\n000\r\n\r\n", 23, true, false, false},
		{"cut at an event boundary", true, -1, sseChunks, len(sseChunks), false, true, false},
		{"cut mid-chunk", true, -1, sseChunks[:40], 40, false, false, false},
		{"cut after the last chunk line", true, -1, sseChunks + "0\r\n", len(sseChunks) + 3, false, false, false},
		{"cut before any chunk", true, -1, "", 0, false, true, false},
		{"cut mid-event", true, -1, "5\r\ndata:\r\n", 10, false, false, false},
		{"bad size", true, -1, "zz\r\nabc", 0, false, false, true},
		{"data not followed by CRLF", true, -1, "3\r\nabcX", 6, false, false, true},
		{"size too large", true, -1, "1000000000000000\r\n", 15, false, false, true},
		{"length complete", false, 10, "0123456789", 10, true, false, false},
		{"length, bytes past it", false, 4, "0123456789", 4, true, false, false},
		{"length short", false, 10, "01234", 5, false, false, false},
		{"close-delimited", false, -1, "anything", 8, false, false, false},
	}
	for _, tc := range cases {
		for _, split := range []bool{false, true} {
			name := tc.name
			if split {
				name += ", byte by byte"
			}
			t.Run(name, func(t *testing.T) {
				f := NewBodyFraming(tc.chunked, tc.length, false)
				n := 0
				if split {
					for i := 0; i < len(tc.in); i++ {
						n += f.Feed([]byte{tc.in[i]})
					}
				} else {
					n = f.Feed([]byte(tc.in))
				}
				if n != tc.accepted || f.Complete() != tc.complete || f.AtEventBoundary() != tc.boundary ||
					(f.Err() != nil) != tc.bad {
					t.Fatalf("accepted %d complete %v boundary %v err %v; want %d %v %v bad=%v",
						n, f.Complete(), f.AtEventBoundary(), f.Err(), tc.accepted, tc.complete, tc.boundary, tc.bad)
				}
				if tc.bad && !errors.Is(f.Err(), ErrBadFraming) {
					t.Fatalf("err %v, want ErrBadFraming", f.Err())
				}
			})
		}
	}
}

// TestTailEnds: the kernel leg's judgement from the last 32 bytes agrees
// with the full parser on every cut of a stream.
func TestTailEnds(t *testing.T) {
	for _, body := range []string{
		sseChunks + "4\r\nab\r\n\r\n" + "0\r\nX-T: 1\r\n\r\n",
		// A trailer longer than the tail, as enginesim sends.
		sseChunks + "0\r\nX-Enginesim-Ttft-Us: 14167\r\n\r\n",
		sseChunks + "0\r\nA: 1\r\nX-Enginesim-Ttft-Us: 14167\r\n\r\n",
		sseChunks + "0\r\nX-Enginesim-Ttft-Us: 14167\r\nX-Enginesim-Queue-Us: 1\r\n\r\n",
	} {
		tailCuts(t, body)
	}
	for _, tc := range []struct {
		tail     string
		whole    bool
		complete bool
	}{
		{"0\r\n\r\n", true, true},
		{"000;ext\r\n\r\n", true, true},
		{"data: x\n\n\r\n", false, false},
		{"data: x\r\n\r\n\r\n", false, false},
		{"ng-trailer: with no chunk line\r\n\r\n", false, true},
	} {
		if c, _ := tailEnds([]byte(tc.tail), tc.whole); c != tc.complete {
			t.Errorf("tailEnds(%q, %v) = %v, want %v", tc.tail, tc.whole, c, tc.complete)
		}
	}
}

// tailCuts checks TailEnds against the full parser at every cut of body.
func tailCuts(t *testing.T, body string) {
	t.Helper()
	for cut := 1; cut <= len(body); cut++ {
		in := []byte(body[:cut])
		f := NewBodyFraming(true, -1, false)
		f.Feed(in)
		tail, whole := in, true
		if len(in) > 32 {
			tail, whole = in[len(in)-32:], false
		}
		complete, boundary := tailEnds(tail, whole)
		if complete != f.Complete() {
			t.Errorf("cut %d (%q): tail says complete=%v, parser %v", cut, tail, complete, f.Complete())
		}
		if boundary && !f.AtEventBoundary() {
			t.Errorf("cut %d (%q): tail says event boundary, parser does not", cut, tail)
		}
	}
}

func TestSSEErrorEvent(t *testing.T) {
	ev := sseErrorEvent(`cut "here"`)
	f := NewBodyFraming(true, -1, false)
	if n := f.Feed(ev); n != len(ev) || f.Err() != nil || !f.AtEventBoundary() {
		t.Fatalf("the error event is not one well-formed chunk: %q (%v)", ev, f.Err())
	}
	if !bytes.Contains(ev, []byte(`"error":{"message":"cut \"here\""`)) {
		t.Fatalf("event %q", ev)
	}
}

// TestBodyEnd: what the body legs ask of a response body through
// datapath.BodyEnd: its state after bytes fed and after bytes skipped (moved
// in the kernel, known by their count and tail), and the bytes that end a
// broken body, which only an event stream stopped at an event boundary has.
func TestBodyEnd(t *testing.T) {
	var _ datapath.BodyEnd = (*BodyFraming)(nil)
	cases := []struct {
		name        string
		chunked     bool
		length      int64
		eventStream bool
		feed        string
		skip        int64  // bytes moved in the kernel, after feed
		tail        string // the body's last bytes then
		complete    bool
		delimited   bool
		seen        int64
		brokenEnd   bool
	}{
		{"event stream cut at an event boundary", true, -1, true, sseChunks, 0, "", false, true, int64(len(sseChunks)), true},
		{"event stream cut mid-chunk", true, -1, true, sseChunks[:40], 0, "", false, true, 40, false},
		{"event stream complete", true, -1, true, sseChunks + "0\r\n\r\n", 0, "", true, true, int64(len(sseChunks)) + 5, false},
		{"chunked JSON cut between chunks", true, -1, false, sseChunks, 0, "", false, true, int64(len(sseChunks)), false},
		{"spliced event stream, tail at an event boundary", true, -1, true, sseChunks[:10], 900, sseChunks[len(sseChunks)-32:], false, true, 910, true},
		{"spliced event stream, tail complete", true, -1, true, sseChunks[:10], 900, sseChunks[len(sseChunks)-27:] + "0\r\n\r\n", true, true, 910, false},
		{"spliced event stream, tail mid-chunk", true, -1, true, sseChunks[:10], 900, sseChunks[len(sseChunks)-40 : len(sseChunks)-8], false, true, 910, false},
		{"content-length short", false, 100, false, "0123456789", 0, "", false, true, 10, false},
		{"content-length, the rest spliced", false, 100, false, "0123456789", 90, "", true, true, 100, false},
		{"content-length, spliced short", false, 100, false, "0123456789", 80, "", false, true, 90, false},
		{"until the backend closes", false, -1, true, "data: x\n\n", 20, "", false, false, 29, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := NewBodyFraming(tc.chunked, tc.length, tc.eventStream)
			f.Feed([]byte(tc.feed))
			if tc.skip > 0 {
				f.Skip(tc.skip, []byte(tc.tail), false)
				if n := f.Feed([]byte("more")); n != 0 {
					t.Fatalf("Feed after Skip took %d bytes", n)
				}
			}
			st := f.State()
			if st.Complete != tc.complete || st.Delimited != tc.delimited || st.Seen != tc.seen || st.Err != nil {
				t.Fatalf("state %+v, want complete %v delimited %v seen %d", st, tc.complete, tc.delimited, tc.seen)
			}
			end := f.BrokenEnd("why")
			if (end != nil) != tc.brokenEnd {
				t.Fatalf("broken end %q, want one: %v", end, tc.brokenEnd)
			}
			if end != nil && !bytes.Equal(end, sseErrorEvent("why")) {
				t.Fatalf("broken end %q is not the error event", end)
			}
		})
	}
}

// bwsBeforeExt finds a chunk-size line with whitespace before its extension.
var bwsBeforeExt = regexp.MustCompile(`[0-9a-fA-F][ \t]+;`)

// FuzzFraming: Feed never accepts more than it is given, does not depend on
// how the bytes are split, and a body it calls complete is one net/http's
// chunked reader reads to its end without error.
func FuzzFraming(f *testing.F) {
	f.Add([]byte(sseChunks+"0\r\n\r\n"), 7)
	f.Add([]byte("3;x=1\r\nabc\r\n0;y\r\nA: b\r\n\r\n"), 1)
	f.Add([]byte("zz\r\n"), 2)
	f.Fuzz(func(t *testing.T, in []byte, step int) {
		whole := NewBodyFraming(true, -1, false)
		n := whole.Feed(in)
		if n < 0 || n > len(in) {
			t.Fatalf("accepted %d of %d", n, len(in))
		}
		step = 1 + (step&0xff)%64
		split := NewBodyFraming(true, -1, false)
		m := 0
		for i := 0; i < len(in); i += step {
			m += split.Feed(in[i:min(len(in), i+step)])
		}
		if m != n || split.Complete() != whole.Complete() || (split.Err() == nil) != (whole.Err() == nil) {
			t.Fatalf("split by %d: accepted %d complete %v err %v; whole: %d %v %v", step, m, split.Complete(), split.Err(), n, whole.Complete(), whole.Err())
		}
		// net/http refuses whitespace between a chunk size and its extension
		// ("0 ;x"), which RFC 9112 §7.1.1 allows as BWS and Framing accepts;
		// such bodies are not compared.
		if whole.Complete() && !bwsBeforeExt.Match(in[:n]) {
			if _, err := io.Copy(io.Discard, httputil.NewChunkedReader(bytes.NewReader(in[:n]))); err != nil {
				t.Fatalf("complete by Framing, but net/http says %v: %q", err, in[:n])
			}
		}
	})
}

// BenchmarkBodyFraming is what a body leg pays to follow an SSE body
// through the datapath.BodyEnd seam: 4 KiB reads of ~100-byte event chunks,
// Feed and State per read, as the userspace leg does.
func BenchmarkBodyFraming(b *testing.B) {
	body := sseBody(1 << 20)
	b.SetBytes(int64(len(body)))
	for range b.N {
		var end datapath.BodyEnd = NewBodyFraming(true, -1, true)
		for p := body; len(p) > 0; {
			n := end.Feed(p[:min(len(p), 4096)])
			if st := end.State(); st.Err != nil || st.Complete {
				b.Fatalf("state %+v", st)
			}
			p = p[n:]
		}
	}
}

// sseBody is at least n bytes of chunked SSE events, without the last chunk.
func sseBody(n int) []byte {
	var body []byte
	for i := 0; len(body) < n; i++ {
		body = append(body, chunkOf(fmt.Sprintf(`data: {"i":%d,"t":"%s"}`+"\n\n", i, bytes.Repeat([]byte("x"), 64)))...)
	}
	return body
}
