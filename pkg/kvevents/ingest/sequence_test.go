package ingest

import "testing"

func TestSeqClassify(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state SeqState
		s     uint64
		want  SeqCase
	}{
		{"nothing known", SeqState{}, 17, SeqFirst},
		{"next", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 11, SeqNext},
		{"duplicate", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 10, SeqDuplicate},
		{"small gap (2)", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 12, SeqSmallGap},
		{"small gap edge L+64", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 74, SeqSmallGap},
		{"large gap L+65", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 75, SeqLargeGap},
		{"restart", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 0, SeqRestart},
		{"restart to L-1", SeqState{Known: true, Last: 10, LiveKnown: true, LastLive: 10}, 9, SeqRestart},
		{"behind a replay: duplicate", SeqState{Known: true, Last: 50, LiveKnown: true, LastLive: 10}, 11, SeqDuplicate},
		{"behind a replay, no live yet", SeqState{Known: true, Last: 50}, 3, SeqDuplicate},
		{"live went back behind a replay", SeqState{Known: true, Last: 50, LiveKnown: true, LastLive: 10}, 10, SeqRestart},
		{"zero after zero", SeqState{Known: true, Last: 0, LiveKnown: true}, 0, SeqDuplicate},
		{"huge", SeqState{Known: true, Last: 1 << 62, LiveKnown: true, LastLive: 1 << 62}, 1<<62 + 1, SeqNext},
	} {
		st := tc.state
		if got := st.Classify(tc.s); got != tc.want {
			t.Errorf("%s: Classify(%d) = %s, want %s", tc.name, tc.s, got, tc.want)
		}
	}
}
