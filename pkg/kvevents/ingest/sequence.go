package ingest

// SeqWindow is the spec's gap window, counted in batch sequence numbers: a
// gap of at most SeqWindow (S ≤ L+SeqWindow) keeps the inventory.
const SeqWindow = 64

// SeqCase classifies a received batch sequence number S against L, the last
// sequence number applied for the same (endpoint, rank).
//
//	case        condition            action
//	First       no L yet             apply S
//	Next        S = L+1              apply S
//	Duplicate   S = L                ignore S
//	            S < L but later than the last live S
//	                                 ignore S (a replay already applied it)
//	SmallGap    L+1 < S ≤ L+64       keep; replay L+1…S−1 and apply it before S
//	LargeGap    S > L+64             replay covers L+1: repair as a small gap;
//	                                 otherwise clear the rank, then apply S
//	Restart     S < L, and S ≤ the last live S (the live stream went back)
//	                                 clear the rank (replay from 0 if possible),
//	                                 then apply S
//
// The first message after a socket rebuild follows the same table with L kept
// from before the rebuild.
type SeqCase uint8

const (
	SeqFirst SeqCase = iota
	SeqNext
	SeqDuplicate
	SeqSmallGap
	SeqLargeGap
	SeqRestart
)

// String names the case for logs and metric labels.
func (c SeqCase) String() string {
	switch c {
	case SeqFirst:
		return "first"
	case SeqNext:
		return "next"
	case SeqDuplicate:
		return "duplicate"
	case SeqSmallGap:
		return "small_gap"
	case SeqLargeGap:
		return "large_gap"
	case SeqRestart:
		return "restart"
	}
	return "unknown"
}

// SeqState is the per-(endpoint, rank) sequence bookkeeping. The zero value
// knows no sequence yet. It survives socket rebuilds.
type SeqState struct {
	// Known reports whether Last holds an applied sequence number.
	Known bool
	// Last is L, the last sequence number applied.
	Last uint64
	// LiveKnown and LastLive track the live stream alone. Replays run ahead
	// of it, so a live S below L is either a batch the replay already
	// applied (the live stream still moves forward) or a restarted engine
	// (the live stream itself went back).
	LiveKnown bool
	LastLive  uint64
}

// Classify returns the case of live sequence number s.
func (st *SeqState) Classify(s uint64) SeqCase {
	if !st.Known {
		return SeqFirst
	}
	l := st.Last
	switch {
	case s == l:
		return SeqDuplicate
	case s < l:
		if !st.LiveKnown || s > st.LastLive {
			return SeqDuplicate
		}
		return SeqRestart
	case s == l+1:
		return SeqNext
	case s-l <= SeqWindow:
		return SeqSmallGap
	default:
		return SeqLargeGap
	}
}

// Live records that live sequence number s was received (after handling it).
func (st *SeqState) Live(s uint64) {
	st.LiveKnown = true
	st.LastLive = s
}

// Applied records that sequence number s was applied.
func (st *SeqState) Applied(s uint64) {
	st.Known = true
	st.Last = s
}
