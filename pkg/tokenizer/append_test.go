package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// AppendChat renders into a buffer the Model reuses and appends the ids to
// the caller's buffer, which the router gives back to an IDPool after
// hashing. Neither buffer may leak into a later result: interleaved
// conversations take turns, two of them sharing their first bytes (one
// system prompt, as many users of one application send), buffers go back to
// the pools and are scribbled over while pooled, and each result must equal
// a fresh encode with every cache off. Were the conversation cache to keep
// the rendered text itself (not a copy), conversation B's render into the
// same buffer would turn A's cached text into B's, and B's next turn would
// reuse A's ids.
// cachedAndFresh loads testdata model name twice: with the daemon's caches,
// and with every cache off, the reference a cached result must equal.
func cachedAndFresh(t *testing.T, name string) (cached, fresh *Model) {
	t.Helper()
	path := filepath.Join("testdata", name, "tokenizer.json")
	cached, err := LoadModel(path)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err = LoadModel(path, WithConversationCache(0), WithPrefixCache(0), WithWordCache(0))
	if err != nil {
		t.Fatal(err)
	}
	return cached, fresh
}

func TestAppendChatReusedBuffers(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			cached, fresh := cachedAndFresh(t, name)
			r := rand.New(rand.NewPCG(7, 8))
			// Valid UTF-8: a text the encode must repair is copied anyway,
			// and would hide a cache that keeps the caller's text.
			grow := func(n int) string { return validUTF8(randomGrowth(r, cached.Tokenizer, n)) }
			// Conversations 0 and 1 share a system prompt (and so a cache
			// bucket: B's render reaching A's cached text is what would show
			// a kept render buffer); 2 and 3 have their own, so their turns
			// reuse their own earlier ids (which would show a kept id buffer).
			shared := grow(9000)
			convs := make([][]map[string]any, 4)
			for i := range convs {
				system := shared
				if i >= 2 {
					system = fmt.Sprintf("system prompt %d. %s", i, grow(9000))
				}
				convs[i] = []map[string]any{{"role": "system", "content": system}}
			}
			var pool IDPool
			scribble := func() {
				for range 4 {
					if b := cached.getRenderBuf(); b != nil {
						b = b[:cap(b)]
						for i := range b {
							b[i] = 'A' + byte(i%26)
						}
						cached.putRenderBuf(b)
					}
					if ids := pool.Get(); ids != nil {
						ids = ids[:cap(ids)]
						for i := range ids {
							ids[i] = 0xfffffff
						}
						pool.Put(ids)
					}
				}
			}
			var held [][]uint32 // results not given back yet
			var heldWant [][]uint32
			for turn := range 16 {
				c := turn % len(convs)
				content := grow(1500 + r.IntN(1500))
				if turn%4 == 3 {
					content = fmt.Sprintf("conversation %d asks again: %s", c, content)
				}
				convs[c] = append(convs[c], map[string]any{"role": "user", "content": content})
				req := ChatRequest{Messages: slices.Clone(convs[c]), Limits: Limits{MaxWordBytes: DefaultMaxWordBytes}}
				want, _, err := fresh.EncodeChat(req)
				if err != nil {
					t.Fatal(err)
				}
				dst := pool.Get()
				if turn%3 == 1 {
					dst = append(dst, 7, 8, 9) // the caller's own elements stay first
				}
				n0 := len(dst)
				got, err := cached.AppendChat(dst, req)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got[:n0], dst[:n0]) || !slices.Equal(got[n0:], want) {
					t.Fatalf("turn %d (conversation %d): AppendChat ids differ from a fresh encode (%d vs %d ids)", turn, c, len(got)-n0, len(want))
				}
				if turn%2 == 0 {
					held, heldWant = append(held, got), append(heldWant, slices.Clone(got))
				} else {
					pool.Put(got)
				}
				scribble()
				for i, h := range held { // buffers still held are never lent out again
					if !slices.Equal(h, heldWant[i]) {
						t.Fatalf("turn %d: a result still held by its caller was overwritten", turn)
					}
				}
				convs[c] = append(convs[c], map[string]any{"role": "assistant", "content": grow(800)})
			}
			if st := cached.PrefixStats(); st.Hits < 12 || st.ReusedBytes < 12*9000 {
				t.Fatalf("conversation cache %+v: want ≥ 12 hits in 16 turns of 4 conversations", st)
			}
		})
	}
}

func TestAppendEncodeLimited(t *testing.T) {
	tk := testTokenizer(t, "qwen3")
	text := strings.Repeat("hello world, the cache ", 40)
	want, err := tk.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		dst     []uint32
		lim     Limits
		wantErr string // LimitCause
	}{
		{"nil dst", nil, Limits{}, ""},
		{"dst with elements and room", append(make([]uint32, 0, 4096), 1, 2, 3), Limits{}, ""},
		{"dst elements do not count against MaxTokens", []uint32{1, 2, 3}, Limits{MaxTokens: len(want)}, ""},
		{"one token short", []uint32{1, 2, 3}, Limits{MaxTokens: len(want) - 1}, CauseTokens},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.dst)
			got, err := tk.AppendEncodeLimited(c.dst, text, false, c.lim)
			if c.wantErr != "" {
				if LimitCause(err) != c.wantErr || !slices.Equal(got, before) {
					t.Fatalf("got %d ids, err %v; want dst back unchanged and a %s limit", len(got), err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got[:len(before)], before) || !slices.Equal(got[len(before):], want) {
				t.Fatalf("AppendEncodeLimited = %d ids after dst, want Encode's %d", len(got)-len(before), len(want))
			}
		})
	}
}

// AppendPromptLimited puts the prompt's special tokens after dst's elements,
// as EncodePrompt puts them first.
func TestAppendPromptLimitedSpecialTokens(t *testing.T) {
	sp, err := NewModel(mustParse(t, sentencePieceJSON(t)), Config{BOSToken: "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	for _, add := range []*bool{nil, boolp(true), boolp(false)} {
		want, err := sp.EncodePrompt("Hello world", add)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sp.AppendPromptLimited([]uint32{42}, "Hello world", add, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, append([]uint32{42}, want...)) {
			t.Errorf("add %v: got %v, want 42 then %v", add, got, want)
		}
	}
}

func TestSharedTextMatchesString(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	var st sharedText
	plain := ""
	for step := range 400 {
		if r.IntN(3) == 0 && len(plain) > 0 {
			n := r.IntN(len(plain) + 1)
			st, plain = st.prefix(n), plain[:n]
		}
		tail := strings.Repeat(string(rune('a'+step%26)), 1+r.IntN(40))
		st, plain = st.extend(tail), plain+tail
		if st.Len() != len(plain) || st.String() != plain || !st.equal(plain) || st.held() < st.Len() {
			t.Fatalf("step %d: shared text (%d bytes, %d held) differs from the plain string (%d bytes)", step, st.Len(), st.held(), len(plain))
		}
		if len(st.segs) > maxTextSegments {
			t.Fatalf("step %d: %d segments, bound %d", step, len(st.segs), maxTextSegments)
		}
		other := plain[:len(plain)/2] + "\x00" + plain[len(plain)/2:]
		if got, want := st.commonPrefix(other), commonPrefix(plain, other); got != want {
			t.Fatalf("step %d: commonPrefix %d, want %d", step, got, want)
		}
		if st.equal(other) || (len(plain) > 0 && st.equal(plain[:len(plain)-1])) {
			t.Fatalf("step %d: equal to a different string", step)
		}
	}
}

// Concurrent AppendChat calls on one Model share its render buffers and one
// IDPool: each must still get its own conversation's ids (run with -race).
func TestAppendChatConcurrent(t *testing.T) {
	cached, fresh := cachedAndFresh(t, "qwen3")
	r := rand.New(rand.NewPCG(13, 14))
	const workers, turns = 4, 5
	reqs := make([][]ChatRequest, workers)
	wants := make([][][]uint32, workers)
	for w := range workers {
		msgs := []map[string]any{{"role": "system", "content": validUTF8(randomGrowth(r, cached.Tokenizer, 9000))}}
		for range turns {
			msgs = append(msgs, map[string]any{"role": "user", "content": validUTF8(randomGrowth(r, cached.Tokenizer, 1000))})
			req := ChatRequest{Messages: slices.Clone(msgs)}
			want, _, err := fresh.EncodeChat(req)
			if err != nil {
				t.Fatal(err)
			}
			reqs[w], wants[w] = append(reqs[w], req), append(wants[w], want)
			msgs = append(msgs, map[string]any{"role": "assistant", "content": "ok"})
		}
	}
	var pool IDPool
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i, req := range reqs[w] {
				got, err := cached.AppendChat(pool.Get(), req)
				if err == nil && !slices.Equal(got, wants[w][i]) {
					err = fmt.Errorf("worker %d turn %d: ids differ from a fresh encode", w, i)
				}
				if err != nil {
					errs <- err
					return
				}
				pool.Put(got)
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// Users of one application share a system prompt. A user's first request
// starts from another user's entry (the prompt is all they share) and must
// not evict it: that user's next turn still reuses their whole history. The
// same conversation moving on replaces its own entry.
func TestConversationCacheKeepsOtherUsers(t *testing.T) {
	m, err := LoadModel(filepath.Join("testdata", "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(19, 20))
	grow := func(n int) string { return validUTF8(randomGrowth(r, m.Tokenizer, n)) }
	system := map[string]any{"role": "system", "content": grow(2000)}
	users := make([][]map[string]any, 3)
	texts := make([]string, len(users))
	for i := range users {
		users[i] = []map[string]any{system, {"role": "user", "content": grow(12000)}}
		if _, texts[i], err = m.EncodeChat(ChatRequest{Messages: users[i]}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range users {
		next := append(slices.Clone(users[i]), map[string]any{"role": "assistant", "content": "ok"}, map[string]any{"role": "user", "content": "and then?"})
		before := m.PrefixStats().ReusedBytes
		if _, _, err := m.EncodeChat(ChatRequest{Messages: next}); err != nil {
			t.Fatal(err)
		}
		// The reuse stops at the last added token (<|im_start|>) before the
		// end of the shared bytes: the previous render's generation prompt.
		if got := int(m.PrefixStats().ReusedBytes - before); got < len(texts[i])-64 {
			t.Fatalf("user %d's next turn reused %d bytes of their %d-byte history", i, got, len(texts[i]))
		}
	}
	if st := m.PrefixStats(); st.Entries != len(users) {
		t.Fatalf("%d entries, want one per user", st.Entries)
	}
}
