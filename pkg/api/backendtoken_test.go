package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
