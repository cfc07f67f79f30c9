package reqfacts

import (
	"strings"
	"testing"
)

// Users of one application send one system prompt, then their own
// conversations. A user's first request reuses another user's system prompt
// only, and must leave that user's array cached: their next turn reuses
// their whole history. (The cache used to replace the entry a lookup
// started from, so users under one system prompt evicted each other on
// every request.) The same conversation moving on still replaces its entry.
func TestMessageCacheKeepsOtherUsers(t *testing.T) {
	system := msg("system", strings.Repeat("s", 600))
	users := [][]string{
		{system, msg("user", strings.Repeat("a", 6000))},
		{system, msg("user", strings.Repeat("b", 6000))},
		{system, msg("user", strings.Repeat("c", 6000))},
	}
	cache := newMessageCache(1<<20, 64, 32)
	for _, u := range users {
		Extract(chatBody(u...), "", Options{Messages: cache})
	}
	for i, u := range users {
		next := append(append([]string(nil), u...), msg("assistant", "ok"), msg("user", "and then?"))
		before := cache.Stats().ReusedBytes
		Extract(chatBody(next...), "", Options{Messages: cache})
		want := int64(len("[" + strings.Join(u, ",")))
		if got := cache.Stats().ReusedBytes - before; got != want {
			t.Fatalf("user %d's next turn reused %d bytes, want their whole history (%d)", i, got, want)
		}
	}
	if st := cache.Stats(); st.Entries != len(users) {
		t.Fatalf("%d entries, want one per user (each next turn replacing its own)", st.Entries)
	}
}
