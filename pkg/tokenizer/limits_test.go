package tokenizer

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	limitTokOnce sync.Once
	limitTok     *Tokenizer
)

// qwen3 loads the committed Qwen3 tokenizer once, with small chunks so the
// chunked path runs on short texts too.
func qwen3(t testing.TB) *Tokenizer {
	t.Helper()
	limitTokOnce.Do(func() {
		limitTok = mustParse(t, mustRead(t, filepath.Join("testdata", "qwen3", "tokenizer.json")), withChunkMin(64))
	})
	return limitTok
}

func TestEncodeLimited(t *testing.T) {
	tk := qwen3(t)
	prose := strings.Repeat("The whole prompt is tokenized, then hashed.\n", 200)
	proseIDs, err := tk.Encode(prose, false)
	if err != nil {
		t.Fatal(err)
	}
	n := len(proseIDs)
	tests := []struct {
		name  string
		text  string
		lim   Limits
		cause string // "" means the ids must equal Encode's
	}{
		{"no limits", prose, Limits{}, ""},
		{"tokens exactly at the limit", prose, Limits{MaxTokens: n}, ""},
		{"one token over", prose, Limits{MaxTokens: n - 1}, CauseTokens},
		{"far over", prose, Limits{MaxTokens: 10}, CauseTokens},
		{"digits: many short words", strings.Repeat("1", 1<<20), Limits{MaxTokens: 1000}, CauseTokens},
		{"one 15 MiB word is cut before merging", strings.Repeat("a", 15<<20), Limits{MaxWordBytes: DefaultMaxWordBytes}, CauseWord},
		{"one whitespace run", strings.Repeat(" ", 1<<20), Limits{MaxWordBytes: DefaultMaxWordBytes}, CauseWord},
		{"newline run", strings.Repeat("\n", 1<<20), Limits{MaxWordBytes: DefaultMaxWordBytes}, CauseWord},
		{"word at the limit", strings.Repeat("a", 4096), Limits{MaxWordBytes: 4096}, ""},
		{"deadline passed", prose, Limits{Deadline: time.Now().Add(-time.Second)}, CauseTime},
		{"generous limits", prose, Limits{MaxTokens: 1 << 20, MaxWordBytes: 1 << 20, Deadline: time.Now().Add(time.Hour)}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tk.EncodeLimited(tc.text, false, tc.lim)
			if tc.cause != "" {
				if !errors.Is(err, ErrLimit) || LimitCause(err) != tc.cause || got != nil {
					t.Fatalf("err %v (cause %q), %d ids: want cause %q and no ids", err, LimitCause(err), len(got), tc.cause)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want, _ := tk.Encode(tc.text, false)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("limited ids differ from Encode's (%d vs %d)", len(got), len(want))
			}
		})
	}
}

// TestLimitLeavesCachesClean: an encode stopped by a limit caches no partial
// chunk, so later encodes of the same text still match a cold tokenizer.
func TestLimitLeavesCachesClean(t *testing.T) {
	data := mustRead(t, filepath.Join("testdata", "qwen3", "tokenizer.json"))
	warm := mustParse(t, data, withChunkMin(64))
	cold := mustParse(t, data, withChunkMin(64), WithPrefixCache(0), WithWordCache(0))
	text := strings.Repeat("Shared system prompt, long enough to span chunks. ", 100)
	for _, max := range []int{5, 50, 300, 700} {
		if _, err := warm.EncodeLimited(text, false, Limits{MaxTokens: max}); LimitCause(err) != CauseTokens {
			t.Fatalf("MaxTokens %d: %v", max, err)
		}
	}
	got, _ := warm.Encode(text, false)
	want, _ := cold.Encode(text, false)
	if !reflect.DeepEqual(got, want) {
		t.Fatal("ids after limited encodes differ from a cold tokenizer's")
	}
}

// BenchmarkPathologicalWord: a one-word prompt under the daemon's limits
// fails at once instead of merging for seconds (docs/tokenizer.md, Bounds).
func BenchmarkPathologicalWord(b *testing.B) {
	tk := qwen3(b)
	for _, size := range []int{1 << 20, 15 << 20} {
		text := strings.Repeat("a", size)
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				if _, err := tk.EncodeLimited(text, false, Limits{MaxTokens: 262144, MaxWordBytes: DefaultMaxWordBytes}); err == nil {
					b.Fatal("no limit hit")
				}
			}
		})
	}
}
