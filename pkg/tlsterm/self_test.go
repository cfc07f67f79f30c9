package tlsterm

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSelfClientConfig: the pin accepts the rule's own listener, follows a
// rotated certificate, and refuses another listener whose certificate the
// same CA signed for the same address.
func TestSelfClientConfig(t *testing.T) {
	f := newFixture(t)
	term, err := New(Options{Dir: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	own := serve(t, term)
	otherDir := filepath.Join(t.TempDir(), "127.0.0.1_8443")
	f.writePair(t, otherDir, "impostor", "127.0.0.1")
	other, err := New(Options{Dir: otherDir})
	if err != nil {
		t.Fatal(err)
	}
	impostor := serve(t, other)

	cases := []struct {
		name   string
		addr   string
		rotate bool
		words  string // "" = accepted
	}{
		{"own listener", own, false, ""},
		{"another listener, same CA and names", impostor, false, "not the one kvgate loaded"},
		{"own listener after a rotation", own, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.rotate {
				f.writePair(t, f.dir, "rotated", "127.0.0.1")
				term.Reload()
			}
			_, err := dial(c.addr, term.SelfClientConfig())
			switch {
			case c.words == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.words != "" && (err == nil || !strings.Contains(err.Error(), c.words)):
				t.Fatalf("want an error with %q, got %v", c.words, err)
			}
		})
	}
}
