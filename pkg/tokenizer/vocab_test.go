package tokenizer

import (
	"fmt"
	"testing"
)

// TestVocabIndex: the flat vocabulary answers as the map it replaced
// (a spelling given twice keeps its last id), for sizes around the table's
// growth points.
func TestVocabIndex(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spellings []string
		ids       []uint32
		want      map[string]uint32
		absent    []string
	}{
		{"empty", nil, nil, map[string]uint32{}, []string{"", "a"}},
		{"one", []string{"a"}, []uint32{7}, map[string]uint32{"a": 7}, []string{"", "b", "aa"}},
		{"prefixes", []string{"ab", "a", "abc", ""}, []uint32{1, 2, 3, 4},
			map[string]uint32{"ab": 1, "a": 2, "abc": 3, "": 4}, []string{"b", "abcd"}},
		{"given twice: the later id wins", []string{"x", "y", "x"}, []uint32{1, 2, 3},
			map[string]uint32{"x": 3, "y": 2}, []string{"z"}},
		{"raw bytes", []string{"\x00", "\xff\xfe", "Ġhello"}, []uint32{0, 1, 2},
			map[string]uint32{"\x00": 0, "\xff\xfe": 1, "Ġhello": 2}, []string{"\x00\x00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkVocab(t, tc.spellings, tc.ids, tc.want, tc.absent)
		})
	}
	for _, n := range []int{5, 6, 1000, 1366, 100000} {
		t.Run(fmt.Sprintf("%d tokens", n), func(t *testing.T) {
			spellings, ids, want := make([]string, n), make([]uint32, n), map[string]uint32{}
			for i := range spellings {
				spellings[i], ids[i] = fmt.Sprintf("tok%d", i), uint32(n-i)
				want[spellings[i]] = ids[i]
			}
			checkVocab(t, spellings, ids, want, []string{"tok", fmt.Sprintf("tok%d", n)})
		})
	}
}

func checkVocab(t *testing.T, spellings []string, ids []uint32, want map[string]uint32, absent []string) {
	t.Helper()
	v, err := newVocabIndex(spellings, ids)
	if err != nil {
		t.Fatal(err)
	}
	for s, id := range want {
		if got, ok := v.get(s); !ok || got != id {
			t.Errorf("get(%q) = %d, %v; want %d", s, got, ok, id)
		}
	}
	for _, s := range absent {
		if got, ok := v.get(s); ok {
			t.Errorf("get(%q) = %d, want absent", s, got)
		}
	}
	seen := map[string]uint32{}
	v.each(func(s string, id uint32) { seen[s] = id })
	if len(seen) != len(want) || v.count() != len(want) {
		t.Errorf("each saw %d spellings, count %d; want %d", len(seen), v.count(), len(want))
	}
	for s, id := range want {
		if seen[s] != id {
			t.Errorf("each gave %q → %d, want %d", s, seen[s], id)
		}
	}
	if load := float64(v.count()) / float64(len(v.slots)); load > 2.0/3 {
		t.Errorf("load %.2f over 2/3", load)
	}
}

// TestStringTable: packed strings read back as given, "" included.
func TestStringTable(t *testing.T) {
	for _, strs := range [][]string{nil, {""}, {"a", "", "bc", ""}, {"", "", "xyz"}} {
		st, err := packStrings(strs)
		if err != nil {
			t.Fatal(err)
		}
		if st.len() != len(strs) {
			t.Fatalf("len = %d, want %d", st.len(), len(strs))
		}
		for i, s := range strs {
			if st.at(i) != s {
				t.Errorf("%q: at(%d) = %q", strs, i, st.at(i))
			}
		}
	}
}
