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

	reply := ReplayReply(7, []byte{0x93, 0x00})
	for _, frames := range [][][]byte{reply, reply[1:]} { // DEALER and REQ views
		seq, payload, end, err := ParseReplayReply(frames)
		if err != nil || end || seq != 7 || !bytes.Equal(payload, []byte{0x93, 0x00}) {
			t.Errorf("ParseReplayReply(%x) = %d %x %v %v", frames, seq, payload, end, err)
		}
	}
	endMsg := ReplayEnd()
	if !bytes.Equal(endMsg[1], bytes.Repeat([]byte{0xff}, 8)) || len(endMsg[0]) != 0 || len(endMsg[2]) != 0 {
		t.Errorf("ReplayEnd = %x", endMsg)
	}
	if seq, _, end, err := ParseReplayReply(endMsg); err != nil || !end || seq != EndSeq {
		t.Errorf("end marker parsed as %d %v %v", seq, end, err)
	}
	for _, bad := range [][][]byte{
		{[]byte("x"), make([]byte, 8), []byte{1}}, // non-empty delimiter
		{nil, make([]byte, 8), nil},               // empty payload, not the end marker
		{make([]byte, 8)},                         // seq only
		{nil, make([]byte, 4), []byte{1}},         // short seq
	} {
		if _, _, _, err := ParseReplayReply(bad); err == nil {
			t.Errorf("ParseReplayReply(%x) accepted", bad)
		}
	}
}
