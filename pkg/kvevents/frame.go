package kvevents

import (
	"encoding/binary"
	"fmt"
)

// ZeroMQ framing of vLLM's ZmqEventPublisher, as pure encode/parse functions
// (the sockets live in pkg/kvevents/ingest). As a DEALER sees them, after the
// ROUTER strips its identity frame:
//
//	PUB message:            [topic, seq (8 bytes big-endian), payload]
//	replay request:         ["", seq8]                 (a REQ socket adds the "" itself)
//	replay reply (current): ["", topic, seq8, payload] (vLLM since mid-2026; docs/parity.md)
//	replay end (current):   ["", "", 0xFF x 8, ""]
//	replay reply (legacy):  ["", seq8, payload]        (vLLM before that change)
//	replay end (legacy):    ["", 0xFF x 8, ""]
//
// A REQ socket sees the same without the leading "". docs/parity.md lists the
// vLLM commits these were checked against.

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

// ReplayLayout is the shape of the replay ROUTER's answers.
type ReplayLayout int

const (
	// ReplayLayoutCurrent: every reply carries the topic frame, as the live
	// PUB message does: ["", topic, seq8, payload]; the end marker carries an
	// empty topic: ["", "", 0xFF x 8, ""].
	ReplayLayoutCurrent ReplayLayout = iota
	// ReplayLayoutLegacy: ["", seq8, payload], end ["", 0xFF x 8, ""].
	ReplayLayoutLegacy
)

// String returns the layout's flag spelling ("current", "legacy").
func (l ReplayLayout) String() string {
	if l == ReplayLayoutLegacy {
		return "legacy"
	}
	return "current"
}

// ParseReplayLayout reads "current" or "legacy".
func ParseReplayLayout(s string) (ReplayLayout, error) {
	switch s {
	case "current", "":
		return ReplayLayoutCurrent, nil
	case "legacy":
		return ReplayLayoutLegacy, nil
	}
	return 0, fmt.Errorf("replay layout %q: allowed values: current, legacy", s)
}

// ReplayReply returns one replayed batch as the ROUTER sends it (after the
// identity frame), in layout l.
func ReplayReply(l ReplayLayout, topic []byte, seq uint64, payload []byte) [][]byte {
	seq8 := AppendSeq(make([]byte, 0, SeqLen), seq)
	if l == ReplayLayoutLegacy {
		return [][]byte{{}, seq8, payload}
	}
	return [][]byte{{}, topic, seq8, payload}
}

// ReplayEnd returns the end-of-replay marker in layout l.
func ReplayEnd(l ReplayLayout) [][]byte {
	seq8 := AppendSeq(make([]byte, 0, SeqLen), EndSeq)
	if l == ReplayLayoutLegacy {
		return [][]byte{{}, seq8, {}}
	}
	return [][]byte{{}, {}, seq8, {}}
}

// ParseReplayReply reads one replay reply in either layout, as a DEALER
// (["", topic, seq8, payload] or ["", seq8, payload]) or a REQ socket
// ([topic, seq8, payload] or [seq8, payload]) receives it. end reports the
// end marker (sequence 0xFF x 8); its payload is empty.
//
// Three frames are either a legacy DEALER reply or a current REQ reply; both
// put the sequence second and the payload third, so they read alike. Four
// frames must start with the empty delimiter: a non-empty topic can then
// never pass for it.
func ParseReplayReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	switch len(frames) {
	case 4:
		if len(frames[0]) != 0 {
			return 0, nil, false, &FrameError{Reason: "replay reply's first frame is not the empty delimiter"}
		}
		frames = frames[2:]
	case 3:
		frames = frames[1:]
	case 2:
	default:
		return 0, nil, false, &FrameError{Reason: fmt.Sprintf("replay reply has %d frames, want [\"\", topic, seq, payload] or [\"\", seq, payload]", len(frames))}
	}
	seq, err = ParseSeq(frames[0])
	if err != nil {
		return 0, nil, false, err
	}
	if seq == EndSeq {
		if len(frames[1]) != 0 {
			return 0, nil, false, &FrameError{Reason: "replay end marker has a payload"}
		}
		return seq, nil, true, nil
	}
	if len(frames[1]) == 0 {
		return 0, nil, false, &FrameError{Reason: "replay reply has an empty payload"}
	}
	return seq, frames[1], false, nil
}
