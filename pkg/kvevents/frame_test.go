package kvevents

import (
	"bytes"
	"errors"
	"testing"
)

func TestFrames(t *testing.T) {
	msg := BuildMessage([]byte("kv-events"), 0x0102030405060708, []byte{0x93})
	topic, seq, payload, err := ParseMessage(msg)
	if err != nil || string(topic) != "kv-events" || seq != 0x0102030405060708 || !bytes.Equal(payload, []byte{0x93}) {
		t.Fatalf("ParseMessage = %q %x %x %v", topic, seq, payload, err)
	}
	if !bytes.Equal(msg[1], []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("seq frame %x", msg[1])
	}
	if got := AppendSeq([]byte{0xaa}, 1); !bytes.Equal(got, []byte{0xaa, 0, 0, 0, 0, 0, 0, 0, 1}) {
		t.Errorf("AppendSeq = %x", got)
	}

	bad := []struct {
		name   string
		frames [][]byte
	}{
		{"two frames", [][]byte{[]byte("t"), make([]byte, 8)}},
		{"four frames", [][]byte{nil, make([]byte, 8), nil, nil}},
		{"short seq", [][]byte{nil, make([]byte, 7), nil}},
		{"long seq", [][]byte{nil, make([]byte, 9), nil}},
	}
	for _, tt := range bad {
		_, _, _, err := ParseMessage(tt.frames)
		var fe *FrameError
		if !errors.As(err, &fe) {
			t.Errorf("%s: err = %v, want *FrameError", tt.name, err)
		}
	}
}

func TestReplayFrames(t *testing.T) {
	req := ReplayRequest(5)
	if len(req) != 2 || len(req[0]) != 0 || !bytes.Equal(req[1], []byte{0, 0, 0, 0, 0, 0, 0, 5}) {
		t.Fatalf("ReplayRequest = %x", req)
	}
	if start, err := ParseReplayRequest(req); err != nil || start != 5 {
		t.Errorf("ParseReplayRequest = %d, %v", start, err)
	}
	for _, bad := range [][][]byte{{req[1]}, {[]byte("x"), req[1]}, {nil, []byte{1}}} {
		if _, err := ParseReplayRequest(bad); err == nil {
			t.Errorf("ParseReplayRequest(%x) accepted", bad)
		}
	}

	seq7 := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	ff := bytes.Repeat([]byte{0xff}, 8)
	p := []byte{0x93, 0x00}
	topic := []byte("kv-events")
	good := []struct {
		name   string
		frames [][]byte
		end    bool
	}{
		{"current DEALER", [][]byte{{}, topic, seq7, p}, false},
		{"current DEALER, empty topic", [][]byte{{}, {}, seq7, p}, false},
		{"current REQ", [][]byte{topic, seq7, p}, false},
		{"legacy DEALER", [][]byte{{}, seq7, p}, false},
		{"legacy REQ", [][]byte{seq7, p}, false},
		{"current end, DEALER", [][]byte{{}, {}, ff, {}}, true},
		{"current end, REQ", [][]byte{{}, ff, {}}, true},
		{"legacy end, DEALER", [][]byte{{}, ff, {}}, true},
		{"legacy end, REQ", [][]byte{ff, {}}, true},
		{"built current", ReplayReply(ReplayLayoutCurrent, topic, 7, p), false},
		{"built legacy", ReplayReply(ReplayLayoutLegacy, topic, 7, p), false},
		{"built current end", ReplayEnd(ReplayLayoutCurrent), true},
		{"built legacy end", ReplayEnd(ReplayLayoutLegacy), true},
	}
	for _, tc := range good {
		seq, payload, end, err := ParseReplayReply(tc.frames)
		switch {
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case end != tc.end:
			t.Errorf("%s: end = %v", tc.name, end)
		case tc.end && seq != EndSeq:
			t.Errorf("%s: end seq = %x", tc.name, seq)
		case !tc.end && (seq != 7 || !bytes.Equal(payload, p)):
			t.Errorf("%s: = %d %x", tc.name, seq, payload)
		}
	}
	if got := ReplayReply(ReplayLayoutCurrent, topic, 7, p); len(got) != 4 || !bytes.Equal(got[1], topic) {
		t.Errorf("current reply = %x", got)
	}
	if got := ReplayEnd(ReplayLayoutCurrent); len(got) != 4 || len(got[1]) != 0 || !bytes.Equal(got[2], ff) {
		t.Errorf("current end = %x", got)
	}
	for _, bad := range [][][]byte{
		{topic, topic, seq7, p},           // 4 frames without the delimiter
		{{}, seq7, p, p},                  // seq where the topic goes, so the "seq" frame is the payload
		{nil, make([]byte, 8), nil},       // empty payload, not the end marker
		{{}, {}, ff, p},                   // end marker with a payload
		{make([]byte, 8)},                 // seq only
		{nil, make([]byte, 4), []byte{1}}, // short seq
		{{}, topic, seq7, p, p},           // 5 frames
	} {
		if _, _, _, err := ParseReplayReply(bad); err == nil {
			t.Errorf("ParseReplayReply(%x) accepted", bad)
		}
	}
	for _, l := range []string{"current", "legacy"} {
		if got, err := ParseReplayLayout(l); err != nil || got.String() != l {
			t.Errorf("ParseReplayLayout(%q) = %v, %v", l, got, err)
		}
	}
	if _, err := ParseReplayLayout("v2"); err == nil {
		t.Error("ParseReplayLayout(v2) accepted")
	}
}

// FuzzFrames: any split of bytes into frames parses or fails cleanly as a
// PUB message and as a replay reply, and what parses rebuilds to the same
// sequence and payload.
//
//	go test -run '^$' -fuzz FuzzFrames -fuzztime 1m ./pkg/kvevents/
func FuzzFrames(f *testing.F) {
	join := func(frames [][]byte) []byte { return bytes.Join(frames, []byte{0xfe, 0xfe}) }
	f.Add(join(ReplayReply(ReplayLayoutCurrent, []byte("kv-events"), 7, []byte{0x93})))
	f.Add(join(ReplayReply(ReplayLayoutLegacy, nil, 7, []byte{0x93})))
	f.Add(join(ReplayEnd(ReplayLayoutCurrent)))
	f.Add(join(BuildMessage([]byte("kv-events"), 3, []byte{0x90})))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := bytes.Split(data, []byte{0xfe, 0xfe})
		if len(frames) > 8 {
			return
		}
		if _, seq, payload, err := ParseMessage(frames); err == nil {
			if got := BuildMessage(frames[0], seq, payload); !bytes.Equal(got[1], frames[1]) {
				t.Fatalf("message seq %d rebuilt as %x, was %x", seq, got[1], frames[1])
			}
		}
		seq, payload, end, err := ParseReplayReply(frames)
		if err != nil {
			return
		}
		if end != (seq == EndSeq) || (!end && len(payload) == 0) {
			t.Fatalf("reply %x: seq %x end %v payload %d bytes", frames, seq, end, len(payload))
		}
	})
}
