package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/state"
)

// TestBackendTokenFileChecks: a rule's backendTokenFile is held to the API
// token file's mode rules on POST and PATCH; a refusal is a 400 naming the
// field, the file and its mode, and never the token.
func TestBackendTokenFileChecks(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "sk-engine-secret\n", 0o600)
	cases := []struct {
		name, path string
		status     int
		words      []string
	}{
		{"0600", good, 200, nil},
		{"0400", write("readonly", "sk-engine-secret\n", 0o400), 200, nil},
		{"world-readable", write("loose", "sk-engine-secret\n", 0o644), 400, []string{"serviceArguments.backendTokenFile", "loose", "mode 0644"}},
		{"group-readable", write("group", "sk-engine-secret\n", 0o640), 400, []string{"serviceArguments.backendTokenFile", "mode 0640", "chmod 0600"}},
		{"missing", filepath.Join(dir, "absent"), 400, []string{"serviceArguments.backendTokenFile", "absent", "no such file"}},
		{"a directory", dir, 400, []string{"serviceArguments.backendTokenFile", "not a regular file"}},
		{"empty", write("empty", "\n\n", 0o600), 400, []string{"serviceArguments.backendTokenFile", "no token"}},
		{"relative", "engine-key", 400, []string{"serviceArguments.backendTokenFile", "absolute path"}},
	}
	base := specBody(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := mutate(t, base, func(a map[string]any, _ []map[string]any) []map[string]any {
				a["backendTokenFile"] = c.path
				return nil
			})
			code, resp := f.do(t, "POST", lbPath, body)
			if code != c.status {
				t.Fatalf("status %d %s, want %d", code, resp, c.status)
			}
			if strings.Contains(resp, "sk-engine-secret") {
				t.Fatalf("the token reached the answer: %s", resp)
			}
			for _, w := range c.words {
				if !strings.Contains(resp, w) {
					t.Errorf("answer %s lacks %q", resp, w)
				}
			}
		})
	}

	// The rule in force keeps the good file; GET shows the path.
	code, list := f.do(t, "GET", lbPath+"/all", "")
	var doc struct {
		LBAttr []struct {
			Args map[string]any `json:"serviceArguments"`
		} `json:"lbAttr"`
	}
	if err := json.Unmarshal([]byte(list), &doc); code != 200 || err != nil || len(doc.LBAttr) != 1 {
		t.Fatalf("GET: %d %s", code, list)
	}
	if got := doc.LBAttr[0].Args["backendTokenFile"]; got != filepath.Join(dir, "readonly") {
		t.Fatalf("backendTokenFile = %v", got)
	}

	// PATCH is held to the same rules.
	path := lbPath + "/externalipaddress/10.10.10.254/port/8080/protocol/tcp"
	if code, resp := f.do(t, "PATCH", path, `{"serviceArguments":{"backendTokenFile":"`+filepath.Join(dir, "loose")+`"}}`); code != 400 ||
		!strings.Contains(resp, "serviceArguments.backendTokenFile") || !strings.Contains(resp, "mode 0644") {
		t.Fatalf("PATCH to a loose file: %d %s", code, resp)
	}
	if code, resp := f.do(t, "PATCH", path, `{"serviceArguments":{"backendTokenFile":null}}`); code != 200 {
		t.Fatalf("PATCH removing the file: %d %s", code, resp)
	}
}

// TestBackendTokenDir: with --backend-token-dir, a backendTokenFile outside
// it (as written, or through a symlink) is refused before the file is read,
// so the answer tells nothing about files elsewhere; a Kubernetes Secret's
// ..data links inside the directory are fine.
func TestBackendTokenDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "backend-tokens")
	secret := filepath.Join(dir, "..2026_12_01")
	if err := os.MkdirAll(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(path, content string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write(filepath.Join(dir, "vllm-key"), "sk-engine\n", 0o600)
	write(filepath.Join(secret, "sglang-key"), "sk-engine\n", 0o400)
	link("..2026_12_01", "..data")
	k8s := link("..data/sglang-key", "sglang-key")
	outside := filepath.Join(root, "root-secret")
	write(outside, "sk-elsewhere\n", 0o644)
	escape := link(outside, "escape")

	f := newFixture(t, t.TempDir(), nil)
	f.srv.opts.BackendTokenDir = dir
	cases := []struct {
		name, path string
		status     int
		words      string
	}{
		{"a file in the directory", filepath.Join(dir, "vllm-key"), 200, ""},
		{"a Kubernetes Secret's links", k8s, 200, ""},
		{"a file elsewhere", outside, 400, outside + " is outside the backend token directory " + dir + " (--backend-token-dir)"},
		{"dot-dot out of the directory", dir + "/../root-secret", 400, "is outside the backend token directory"},
		{"the directory itself", dir, 400, "is outside the backend token directory"},
		{"a symlink leading out", escape, 400, escape + " leads outside the backend token directory"},
		{"a missing file in the directory", filepath.Join(dir, "absent"), 400, "no such file"},
	}
	base := specBody(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := mutate(t, base, func(a map[string]any, _ []map[string]any) []map[string]any {
				a["backendTokenFile"] = c.path
				return nil
			})
			code, resp := f.do(t, "POST", lbPath, body)
			if code != c.status || !strings.Contains(resp, c.words) {
				t.Fatalf("status %d %s, want %d with %q", code, resp, c.status, c.words)
			}
			if c.status == 400 && strings.Contains(resp, "outside") && strings.Contains(resp, "mode") {
				t.Fatalf("a refusal for a file outside the directory describes the file: %s", resp)
			}
		})
	}
}

// TestRestoredBackendTokenOutsideDir: a saved rule whose backendTokenFile is
// outside today's --backend-token-dir is kept but not started.
func TestRestoredBackendTokenOutsideDir(t *testing.T) {
	stateDir := t.TempDir()
	key := filepath.Join(t.TempDir(), "engine-key")
	if err := os.WriteFile(key, []byte("sk-engine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, stateDir, nil)
	body := mutate(t, specBody(t), func(a map[string]any, _ []map[string]any) []map[string]any {
		a["backendTokenFile"] = key
		return nil
	})
	if code, resp := f.do(t, "POST", lbPath, body); code != 200 {
		t.Fatalf("POST: %d %s", code, resp)
	}
	f.ts.Close()

	st, err := state.Open(stateDir, quiet())
	if err != nil {
		t.Fatal(err)
	}
	rules, err := st.Load()
	if err != nil || len(rules) != 1 {
		t.Fatalf("saved rules: %v %v", rules, err)
	}
	sink := &recordingSink{}
	srv := New(Options{Settings: config.DefaultSettings(), Sink: sink, Store: st, BackendTokenDir: t.TempDir(), Log: quiet()})
	if err := srv.Restore(rules); err != nil {
		t.Fatal(err)
	}
	if len(sink.changes) != 0 || len(srv.Rules()) != 1 {
		t.Fatalf("restored rule started (%d sink calls) or lost (%d rules)", len(sink.changes), len(srv.Rules()))
	}
}
