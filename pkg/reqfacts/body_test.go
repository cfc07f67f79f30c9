package reqfacts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// legacyScan is how bodies were read before the one-pass reader:
// json.Unmarshal into raw fields, then chattemplate.DecodeMessages of the
// messages field. scanBody must agree with it on every input.
func legacyScan(data []byte) (b body, msgs []map[string]any, msgErr, err error) {
	if err = json.Unmarshal(data, &b); err != nil {
		return b, nil, nil, err
	}
	if present(b.Messages) {
		msgs, msgErr = chattemplate.DecodeMessages(b.Messages)
	}
	return b, msgs, msgErr, nil
}

// checkScanAgrees compares scanBody (through cache, which may be nil) with
// legacyScan on one body.
func checkScanAgrees(t *testing.T, data []byte, cache *MessageCache) {
	t.Helper()
	want, wantMsgs, wantMsgErr, wantErr := legacyScan(data)
	got, gotErr := scanBody(data, true, cache)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("body %.120q: scan error %v, json.Unmarshal error %v", data, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	gv, wv := reflect.ValueOf(got.body), reflect.ValueOf(want)
	for i := range gv.NumField() {
		if g, w := gv.Field(i).Bytes(), wv.Field(i).Bytes(); !bytes.Equal(g, w) {
			t.Fatalf("body %.120q: field %s = %q, json.Unmarshal gave %q", data, gv.Type().Field(i).Name, g, w)
		}
	}
	if !present(want.Messages) {
		return
	}
	if (got.messagesErr == nil) != (wantMsgErr == nil) {
		t.Fatalf("body %.120q: messages error %v, DecodeMessages error %v", data, got.messagesErr, wantMsgErr)
	}
	if len(got.messages) == 0 && len(wantMsgs) == 0 {
		return
	}
	if !reflect.DeepEqual(got.messages, wantMsgs) {
		t.Fatalf("body %.120q: messages\n%#v\nDecodeMessages gave\n%#v", data, got.messages, wantMsgs)
	}
}

func TestScanBodyMatchesUnmarshal(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct{ name, body string }{
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":4}`},
		{"every field", `{"model":"m","prompt":"p","messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],"documents":[{"t":"d"}],"chat_template_kwargs":{"enable_thinking":false},"chat_template":"{{x}}","reasoning_effort":"low","add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"truncate_prompt_tokens":5,"cache_salt":"s","stream":false,"user":"u"}`},
		{"reordered keys", `{"messages":[{"content":"hi","role":"user"}],"model":"m"}`},
		{"repeated field, last wins", `{"model":"a","model":"b","messages":[{"role":"user","content":"1"}],"messages":[{"role":"user","content":"2"}]}`},
		{"case-folded field names", `{"MODEL":"m","Messages":[{"role":"user","content":"x"}],"Stream":true}`},
		{"exact name after folded one", `{"Model":"a","model":"b"}`},
		{"long s and Kelvin sign fold", `{"meſſages":[{"role":"user","content":"x"}],"chat_template_\u212awargs":{"a":1}}`},
		{"escaped key", `{"mod\u0065l":"m","m\u0065ssages":[{"role":"user","content":"x"}]}`},
		{"unicode escapes in content", `{"model":"m","messages":[{"role":"user","content":"\u00e9\ud83d\ude42\ud800 \"q\" \\ \/"}]}`},
		{"invalid UTF-8 in content", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\"}]}"},
		{"multimodal parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`},
		{"tool calls", `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":[1,2.5e3]}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`},
		{"numbers", `{"model":"m","messages":[{"role":"user","content":"x","n":[0,-0,1.5,1e400,123456789012345678901234567890]}]}`},
		{"messages null", `{"model":"m","messages":null}`},
		{"messages a string", `{"model":"m","messages":"hi"}`},
		{"message not an object", `{"model":"m","messages":[{"role":"user","content":"x"},3]}`},
		{"messages nested beyond the template bound", `{"model":"m","messages":[{"role":"user","content":"x","d":` + deep(200) + `}]}`},
		{"messages nested at the template bound", `{"model":"m","messages":[{"role":"user","content":"x","d":` + deep(197) + `}]}`},
		{"body nested beyond encoding/json's bound", `{"model":"m","x":` + deep(chattemplate.MaxSkipDepth) + `}`},
		{"body nested at encoding/json's bound", `{"model":"m","x":` + deep(chattemplate.MaxSkipDepth-1) + `}`},
		{"invalid after the messages", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":tru}`},
		{"invalid inside a message", `{"model":"m","messages":[{"role":"user","content":"x",}]}`},
		{"invalid after a bad-shape messages", `{"messages":"x","model":01}`},
		{"control character", "{\"model\":\"m\x01\"}"},
		{"trailing data", `{"model":"m"} {}`},
		{"trailing whitespace", "{\"model\":\"m\"} \n\t"},
		{"empty object", `{}`},
		{"unclosed", `{"model":"m"`},
		{"missing comma", `{"model":"m" "stream":true}`},
		{"not an object", `["model"]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkScanAgrees(t, []byte(tc.body), nil) })
	}
}

// chatBody is a chat request body whose messages are given as raw JSON
// objects, so tests control every byte.
func chatBody(msgs ...string) []byte {
	return []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `],"stream":true}`)
}

func msg(role, content string) string {
	c, _ := json.Marshal(content)
	return `{"role":"` + role + `","content":` + string(c) + `}`
}

// TestMessageCacheEqualsFull: bodies read through a cache give exactly the
// facts of a read without one, whatever changed from the turn before.
// Before the cache, this test could not fail; it guards the reuse rule
// (only messages ending inside the common byte prefix are reused).
func TestMessageCacheEqualsFull(t *testing.T) {
	long := strings.Repeat("the routing kernel caches blocks. ", 40)
	base := []string{msg("system", "You are a router. "+long), msg("user", "q1 "+long), msg("assistant", "a1 "+long)}
	grow := func(extra ...string) []string { return append(append([]string(nil), base...), extra...) }
	tests := []struct {
		name  string
		turns [][]byte
		noHit bool // nothing can be reused
	}{
		{name: "growing conversation", turns: [][]byte{chatBody(base...), chatBody(grow(msg("user", "q2"))...), chatBody(grow(msg("user", "q2"), msg("assistant", "a2"), msg("user", "q3"))...)}},
		{name: "new question each time", turns: [][]byte{chatBody(grow(msg("user", "x"))...), chatBody(grow(msg("user", "y"))...), chatBody(grow(msg("user", "z"))...)}},
		{name: "earlier message edited", turns: [][]byte{chatBody(grow(msg("user", "q2"))...), chatBody(append([]string{base[0], msg("user", "Q1 "+long)}, base[2], msg("user", "q2"))...)}},
		{name: "last message extended in place", turns: [][]byte{chatBody(base...), chatBody(base[0], base[1], msg("assistant", "a1 "+long+" more"))}},
		{name: "keys reordered in an earlier message", turns: [][]byte{chatBody(base...), chatBody(base[0], `{"content":"q1 `+long+`","role":"user"}`, base[2], msg("user", "q2"))}},
		{name: "escape instead of a raw byte", turns: [][]byte{chatBody(base...), chatBody(strings.Replace(base[0], "router", `r\u006futer`, 1), base[1], base[2])}, noHit: true},
		{name: "number grows at a message's end", turns: [][]byte{chatBody(base[0], `{"role":"user","content":"x","n":12}`), chatBody(base[0], `{"role":"user","content":"x","n":123}`)}},
		{name: "fewer messages", turns: [][]byte{chatBody(grow(msg("user", "q2"))...), chatBody(base[:2]...)}},
		{name: "tools and multimodal parts", turns: [][]byte{
			chatBody(grow(`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`)...),
			chatBody(grow(`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`, `{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"t"}]}`)...),
		}},
		{name: "a non-object after the reused messages", turns: [][]byte{chatBody(base...), chatBody(grow("7")...)}},
		{name: "invalid JSON after the reused messages", turns: [][]byte{chatBody(base...), chatBody(grow(`{"role":"user","content":"x",}`)...)}},
		{name: "same body twice", turns: [][]byte{chatBody(base...), chatBody(base...)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cache := newMessageCache(1<<20, 64, 32)
			hits := int64(0) // of Extract on a later turn; checkScanAgrees hits too
			for i, b := range tc.turns {
				before := cache.Stats().Hits
				got := Extract(b, "", Options{Messages: cache})
				if i > 0 {
					hits += cache.Stats().Hits - before
				}
				want := Extract(b, "", Options{})
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("turn %d: cached facts\n%+v\nfull read\n%+v", i, got, want)
				}
				checkScanAgrees(t, b, cache)
			}
			if (hits > 0) == tc.noHit {
				t.Fatalf("%d cache hits; want hits: %v", hits, !tc.noHit)
			}
		})
	}
}

// TestMessageCacheReuses: a growing conversation decodes only its new
// messages, and the bytes reused are the previous turn's messages.
func TestMessageCacheReuses(t *testing.T) {
	long := strings.Repeat("x", 2000)
	turn1 := []string{msg("system", long), msg("user", long)}
	turn2 := append(append([]string(nil), turn1...), msg("assistant", "a"), msg("user", "b"))
	cache := newMessageCache(1<<20, 64, 32)
	var observed []int
	cache.Observe(func(hit bool, reused int) {
		if hit != (reused > 0) {
			t.Errorf("observed hit %v with %d bytes reused", hit, reused)
		}
		observed = append(observed, reused)
	})
	Extract(chatBody(turn1...), "", Options{Messages: cache})
	Extract(chatBody(turn2...), "", Options{Messages: cache})
	st := cache.Stats()
	wantReused := int64(len("[" + strings.Join(turn1, ",")))
	if st.Hits != 1 || st.ReusedBytes != wantReused || st.Entries != 1 {
		t.Fatalf("stats %+v, want 1 hit reusing %d bytes and the second turn replacing the first", st, wantReused)
	}
	if len(observed) != 2 || observed[0] != 0 || int64(observed[1]) != wantReused {
		t.Fatalf("observed lookups %v, want a miss then %d bytes reused", observed, wantReused)
	}
}

// TestMessageCacheBounded: the cache never holds more than its limit, an
// array larger than the limit is not kept, and at most entriesPerStart
// arrays share a start.
func TestMessageCacheBounded(t *testing.T) {
	const limit = 64 << 10
	cache := newMessageCache(limit, 64, 32)
	for i := range 200 {
		body := chatBody(msg("system", fmt.Sprintf("conversation %d ", i)+strings.Repeat("y", 1000+i*10)), msg("user", "q"))
		Extract(body, "", Options{Messages: cache})
		if st := cache.Stats(); st.Bytes > limit || st.Bytes < 0 {
			t.Fatalf("after %d bodies the cache holds %d bytes, limit %d", i+1, st.Bytes, limit)
		}
	}
	if st := cache.Stats(); st.Entries == 0 || st.Entries >= 200 {
		t.Fatalf("%d entries after 200 distinct conversations under %d bytes", st.Entries, limit)
	}
	huge := chatBody(msg("user", strings.Repeat("z", limit)))
	before := cache.Stats().Entries
	Extract(huge, "", Options{Messages: cache})
	if st := cache.Stats(); st.Entries > before || st.Bytes > limit {
		t.Fatalf("an array above the limit was kept: %+v", st)
	}
	shared := newMessageCache(1<<30, 64, 32)
	for i := range 3 * entriesPerStart {
		Extract(chatBody(msg("system", strings.Repeat("s", 100)), msg("user", fmt.Sprintf("user %d", i))), "", Options{Messages: shared})
	}
	if st := shared.Stats(); st.Entries > entriesPerStart {
		t.Fatalf("%d entries share one start, at most %d allowed", st.Entries, entriesPerStart)
	}
}

func FuzzScanBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}`), []byte(`{"role":"user","content":"\u00e9"}`))
	f.Add([]byte(`{"Messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"model":"m"}`), []byte(`7`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x","n":12}]}`), []byte(`{"role":"user"`))
	f.Fuzz(func(t *testing.T, first, extra []byte) {
		if len(first) > 1<<14 || len(extra) > 1<<12 {
			return
		}
		cache := newMessageCache(1<<20, 16, 8)
		checkScanAgrees(t, first, cache)
		// The next turn: the same body with one more message, through the
		// cache the first turn filled.
		if i := bytes.LastIndex(first, []byte("}]")); i >= 0 {
			next := append(append(append(bytes.Clone(first[:i+1]), ','), extra...), first[i+1:]...)
			checkScanAgrees(t, next, cache)
		}
	})
}

// TestMessageCacheSegments: a conversation growing for many turns keeps
// its cached bytes in a bounded number of segments, copies only each turn's
// new bytes until that bound, and every turn's facts equal a full read.
func TestMessageCacheSegments(t *testing.T) {
	cache := newMessageCache(64<<20, 64, 32)
	msgs := []string{msg("system", strings.Repeat("s", 500))}
	for turn := range 3 * maxSegments {
		msgs = append(msgs, msg("user", fmt.Sprintf("question %d %s", turn, strings.Repeat("q", 50))))
		body := chatBody(msgs...)
		got := Extract(body, "", Options{Messages: cache})
		if want := Extract(body, "", Options{}); !reflect.DeepEqual(got, want) {
			t.Fatalf("turn %d: cached facts differ from a full read", turn)
		}
		cache.mu.Lock()
		for _, e := range cache.byStart {
			for _, entry := range e {
				if len(entry.raw) > maxSegments+1 {
					t.Fatalf("turn %d: %d segments, at most %d", turn, len(entry.raw), maxSegments+1)
				}
				if turn > 0 && turn < maxSegments && len(entry.raw) != turn+1 {
					t.Fatalf("turn %d: %d segments, want one per turn (the new bytes only)", turn, len(entry.raw))
				}
			}
		}
		cache.mu.Unlock()
	}
}

// TestMessageCacheConcurrent: requests of several growing conversations
// through one cache at once (run under -race) all get a full read's facts.
func TestMessageCacheConcurrent(t *testing.T) {
	cache := newMessageCache(256<<10, 64, 32)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := []string{msg("system", "shared system prompt "+strings.Repeat("p", 300))}
			for turn := range 30 {
				msgs = append(msgs, msg("user", fmt.Sprintf("conversation %d turn %d", g%2, turn)))
				body := chatBody(msgs...)
				if got, want := Extract(body, "", Options{Messages: cache}), Extract(body, "", Options{}); !reflect.DeepEqual(got, want) {
					t.Errorf("conversation %d turn %d: cached facts differ from a full read", g, turn)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st := cache.Stats(); st.Hits == 0 || st.Bytes > 256<<10 {
		t.Fatalf("stats %+v: want hits within the bound", st)
	}
}
