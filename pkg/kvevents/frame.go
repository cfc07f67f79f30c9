package kvevents

import (
	"encoding/binary"
	"fmt"
)

// ZeroMQ framing of vLLM's ZmqEventPublisher, as pure encode/parse functions
// (the sockets live in the subscriber):
//
//	PUB message:     [topic, seq (8 bytes big-endian), payload]
//	replay request:  ["", seq8]              (DEALER; a REQ socket adds the "" itself)
//	replay reply:    ["", seq8, payload]     (REQ sockets see [seq8, payload])
//	replay end:      ["", 0xFF x 8, ""]

// SeqLen is the length of a sequence-number frame.
const SeqLen = 8

// EndSeq is the sequence number of the replay end marker (-1 as int64).
const EndSeq = ^uint64(0)

// FrameError reports a message whose frames do not have the expected shape.
type FrameError struct{ Reason string }

func (e *FrameError) Error() string { return "kvevents: bad frames: " + e.Reason }

// AppendSeq appends seq as the 8-byte big-endian frame vLLM sends.
func AppendSeq(dst []byte, seq uint64) []byte { return binary.BigEndian.AppendUint64(dst, seq) }

// ParseSeq reads a sequence frame; it must be exactly 8 bytes.
func ParseSeq(frame []byte) (uint64, error) {
	if len(frame) != SeqLen {
		return 0, &FrameError{Reason: fmt.Sprintf("sequence frame has %d bytes, want %d", len(frame), SeqLen)}
	}
	return binary.BigEndian.Uint64(frame), nil
}

// BuildMessage returns the three frames of one published batch.
func BuildMessage(topic []byte, seq uint64, payload []byte) [][]byte {
	return [][]byte{topic, AppendSeq(make([]byte, 0, SeqLen), seq), payload}
}

// ParseMessage splits a PUB message [topic, seq, payload]. The returned
// slices alias frames.
func ParseMessage(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return nil, 0, nil, &FrameError{Reason: fmt.Sprintf("message has %d frames, want 3 [topic, seq, payload]", len(frames))}
	}
	seq, err = ParseSeq(frames[1])
	if err != nil {
		return nil, 0, nil, err
	}
	return frames[0], seq, frames[2], nil
}

// ReplayRequest returns the frames a DEALER sends to ask the publisher's
// ROUTER for every buffered batch with sequence >= start: ["", seq8].
func ReplayRequest(start uint64) [][]byte {
	return [][]byte{{}, AppendSeq(make([]byte, 0, SeqLen), start)}
}

// ParseReplayRequest reads a replay request as the ROUTER sees it after the
// identity frame: ["", seq8]. vLLM ignores any other shape.
func ParseReplayRequest(frames [][]byte) (start uint64, err error) {
	if len(frames) != 2 || len(frames[0]) != 0 {
		return 0, &FrameError{Reason: fmt.Sprintf("replay request has %d frames, want 2 [\"\", seq]", len(frames))}
	}
	return ParseSeq(frames[1])
}

// ReplayReply returns one replayed batch as the ROUTER sends it (after the
// identity frame): ["", seq8, payload].
func ReplayReply(seq uint64, payload []byte) [][]byte {
	return [][]byte{{}, AppendSeq(make([]byte, 0, SeqLen), seq), payload}
}

// ReplayEnd returns the end-of-replay marker: ["", 0xFF x 8, ""].
func ReplayEnd() [][]byte {
	return [][]byte{{}, AppendSeq(make([]byte, 0, SeqLen), EndSeq), {}}
}

// ParseReplayReply reads one replay reply as a DEALER (["", seq8, payload])
// or a REQ socket ([seq8, payload]) receives it. end reports the end marker
// (sequence 0xFF x 8); its payload is empty.
func ParseReplayReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) == 3 {
		if len(frames[0]) != 0 {
			return 0, nil, false, &FrameError{Reason: "replay reply's first frame is not empty"}
		}
		frames = frames[1:]
	}
	if len(frames) != 2 {
		return 0, nil, false, &FrameError{Reason: fmt.Sprintf("replay reply has %d frames, want [\"\", seq, payload]", len(frames))}
	}
	seq, err = ParseSeq(frames[0])
	if err != nil {
		return 0, nil, false, err
	}
	if seq == EndSeq {
		return seq, nil, true, nil
	}
	if len(frames[1]) == 0 {
		return 0, nil, false, &FrameError{Reason: "replay reply has an empty payload"}
	}
	return seq, frames[1], false, nil
}
