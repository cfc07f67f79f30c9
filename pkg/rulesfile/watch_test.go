package rulesfile

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
)

// fakeTable is an Applier that records what it was given, and can refuse.
type fakeTable struct {
	mu      sync.Mutex
	applied [][]api.FileRule
	refuse  error
}

func (f *fakeTable) ReconcileFile(_ string, rules []api.FileRule) (api.ReconcileResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return api.ReconcileResult{Checked: true}, f.refuse
	}
	f.applied = append(f.applied, rules)
	return api.ReconcileResult{Checked: true, Created: len(rules)}, nil
}

type results struct{ got []string }

func (r *results) RulesFileReload(result string, _ int, _ time.Time) { r.got = append(r.got, result) }

func writeFile(t *testing.T, path, body string, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil { // a distinct mtime per edit, whatever the clock's grain
		t.Fatal(err)
	}
}

// TestWatcherFollowsTheFile: an edit is reconciled, a bad edit is refused
// and reported without a call to the table, a fix is applied, a touch with
// the same content is not re-applied, and a refused apply is retried.
func TestWatcherFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	mod := time.Now().Add(-time.Hour)
	writeFile(t, path, `{"rules":[`+okRule+`]}`, mod)
	table, obs := &fakeTable{}, &results{}
	w, err := New(Options{Path: path, Settings: config.DefaultSettings(), Apply: table, Observer: obs, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name, body string
		want       string // the last result; "" means no reconcile
		applied    int
	}{
		{"unchanged", "", "", 1},
		{"bad edit", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":8000,"mode":4},"endpoints":[{"endpointIP":"10.0.0.11","targetPort":8000}]}]}`, ResultInvalid, 1},
		{"fixed", `{"rules":[]}`, ResultOK, 2},
		{"touched", `{"rules":[]}`, "", 2},
	}
	for _, s := range steps {
		n := len(obs.got)
		if s.body != "" {
			mod = mod.Add(time.Second)
			writeFile(t, path, s.body, mod)
		}
		w.Check()
		switch {
		case s.want == "" && len(obs.got) != n:
			t.Fatalf("%s: reconciled again: %v", s.name, obs.got)
		case s.want != "" && (len(obs.got) != n+1 || obs.got[n] != s.want):
			t.Fatalf("%s: results %v, want %s last", s.name, obs.got, s.want)
		case len(table.applied) != s.applied:
			t.Fatalf("%s: %d applies, want %d", s.name, len(table.applied), s.applied)
		}
	}
	table.refuse = &config.ConflictError{Msg: "port in use"}
	mod = mod.Add(time.Second)
	writeFile(t, path, `{"rules":[`+okRule+`]}`, mod)
	w.Check()
	w.Check() // retried without a file change
	if got := obs.got[len(obs.got)-2:]; got[0] != ResultPartial || got[1] != ResultPartial {
		t.Fatalf("refused apply: %v", obs.got)
	}
	table.refuse = nil
	w.Check()
	if obs.got[len(obs.got)-1] != ResultOK || len(table.applied) != 3 {
		t.Fatalf("retry after the refusal cleared: %v, %d applies", obs.got, len(table.applied))
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	w.Check()
	w.Check()
	if obs.got[len(obs.got)-1] != ResultInvalid || obs.got[len(obs.got)-2] != ResultOK {
		t.Fatalf("a vanished file is reported once: %v", obs.got)
	}
	if len(table.applied) != 3 {
		t.Fatal("a vanished file changed the table")
	}
}

func TestWatcherOptions(t *testing.T) {
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Apply: &fakeTable{}}, "no path"},
		{Options{Path: "x", Interval: time.Millisecond, Apply: &fakeTable{}}, "--rules-file-interval=1ms"},
		{Options{Path: "x"}, "no applier"},
	} {
		if _, err := New(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.opts, err, c.want)
		}
	}
	w, err := New(Options{Path: filepath.Join(t.TempDir(), "missing"), Apply: &fakeTable{}, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file at start: %v", err)
	}
}
