package state

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func gen(n int) []config.Rule {
	var rules []config.Rule
	for i := 1; i <= n; i++ {
		seed := "0"
		r := config.Rule{ServiceID: i, Args: config.ServiceArguments{ExternalIP: "10.0.0.1", Port: 8000 + i, Protocol: "tcp", Mode: 4, KVExactMode: 3, KVHashSeed: &seed},
			Endpoints: []config.Endpoint{{IP: "10.0.1.1", TargetPort: 8000, Weight: 1}, {IP: "10.0.1.2", TargetPort: 8000, Weight: 1, AdminDown: true}}}
		r.AssignIndices(nil)
		rules = append(rules, r)
	}
	return rules
}

func mustOpen(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRoundTripAndCreateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "state")
	s := mustOpen(t, dir)
	got, err := s.Load()
	if err != nil || len(got) != 0 {
		t.Fatalf("fresh dir: %v %v", got, err)
	}
	want := gen(3)
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err = mustOpen(t, dir).Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if fi, _ := os.Stat(filepath.Join(dir, fileName)); fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v", fi.Mode().Perm())
	}
}

// A file truncated at any length never loses the previous good state.
func TestTruncatedAtEveryLength(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	old, cur := gen(1), gen(2)
	if err := s.Save(old); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(cur); err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	prevBytes, _ := os.ReadFile(s.Path() + prevSuffix)
	complete := len(strings.TrimRight(string(full), "\n"))
	for n := 0; n < complete; n++ {
		if n > 64 && n < complete-64 && n%13 != 0 {
			continue // every length near the ends, a sample in between (each load fsyncs)
		}
		if err := os.WriteFile(s.Path(), full[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.Path()+prevSuffix, prevBytes, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := mustOpen(t, dir).Load()
		if err != nil {
			t.Fatalf("truncated at %d: %v", n, err)
		}
		if !reflect.DeepEqual(got, old) {
			t.Fatalf("truncated at %d: got %d rules, want the previous generation", n, len(got))
		}
	}
}

func TestCorruptCurrentThenSaveKeepsGoodPrevious(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Save(gen(1)))
	must(s.Save(gen(2)))
	// Flip a byte inside the payload: valid JSON, wrong checksum.
	b, _ := os.ReadFile(s.Path())
	i := strings.Index(string(b), "10.0.1.2")
	b[i+7] = '9'
	must(os.WriteFile(s.Path(), b, 0o600))
	got, err := s.Load()
	must(err)
	if len(got) != 1 {
		t.Fatalf("want the previous generation (1 rule), got %d", len(got))
	}
	matches, _ := filepath.Glob(filepath.Join(dir, fileName+".corrupt-*"))
	if len(matches) != 1 {
		t.Errorf("corrupt file not kept aside: %v", matches)
	}
	must(s.Save(gen(3)))
	prev, err := readFile(s.Path() + prevSuffix)
	must(err)
	if len(prev) != 1 {
		t.Errorf("previous generation after save = %d rules, want 1", len(prev))
	}
}

func TestInterruptedWrite(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(gen(1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(gen(2)); err != nil {
		t.Fatal(err)
	}
	// Crash after "current → prev" and before "tmp → current": no current file, a half temp file.
	if err := os.Rename(s.Path(), s.Path()+prevSuffix); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, tmpPrefix+"123"), []byte(`{"format":"kvgate-ru`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil || len(got) != 2 {
		t.Fatalf("got %d rules, %v; want 2", len(got), err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*")); len(m) != 0 {
		t.Errorf("stale temp files left: %v", m)
	}
	if _, err := os.Stat(s.Path()); err != nil {
		t.Errorf("restored generation not made current: %v", err)
	}
}

func TestBothGenerationsBad(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := os.WriteFile(s.Path(), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil {
		t.Fatal("a corrupt state with no previous generation must be an error, not an empty state")
	}
	if _, err := os.Stat(s.Path()); err != nil {
		t.Error("the unreadable file must stay for the operator")
	}
}

func FuzzReadFile(f *testing.F) {
	dir := f.TempDir()
	s, _ := Open(dir, quietLog())
	_ = s.Save(gen(2))
	good, _ := os.ReadFile(s.Path())
	f.Add(good)
	f.Add([]byte(`{"format":"kvgate-rules/1","sha256":"","rules":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = readFile(p)
	})
}
