package apiauth

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const (
	adminTok = "admin-token-0123456789abcdef"
	readTok  = "read-token-0123456789abcdef"
)

func writeSecret(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // WriteFile keeps an existing file's mode
		t.Fatal(err)
	}
}

func TestParseTokens(t *testing.T) {
	tests := []struct {
		name, file, err string
		n               int
	}{
		{"two tokens and comments", "# ops\nops admin " + adminTok + "\n\n  dash read " + readTok + "  \n", "", 2},
		{"wrong field count", "ops admin", "line 1: want", 0},
		{"unknown role", "ops root " + adminTok, `role "root"; allowed values: admin, read`, 0},
		{"short token", "ops admin short", "the token must be 16-4096 characters", 0},
		{"duplicate name", "ops admin " + adminTok + "\nops read " + readTok, `name "ops" is used twice`, 0},
		{"duplicate token", "a admin " + adminTok + "\nb read " + adminTok, "the same token as a", 0},
		{"empty", "# nothing\n", "no token", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := ParseTokens([]byte(tc.file))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || tok.Len() != tc.n {
				t.Fatalf("err %v, %d tokens", err, tok.Len())
			}
			// The error never quotes a token.
		})
	}
	tok, _ := ParseTokens([]byte("ops admin " + adminTok + "\ndash read " + readTok))
	for _, c := range []struct {
		token string
		want  Identity
		ok    bool
	}{{adminTok, Identity{"ops", RoleAdmin}, true}, {readTok, Identity{"dash", RoleRead}, true}, {adminTok + "x", Identity{}, false}, {"", Identity{}, false}} {
		if got, ok := tok.Lookup(c.token); ok != c.ok || got != c.want {
			t.Errorf("Lookup(%q) = %v %v", c.token, got, ok)
		}
	}
}

func TestCheckSecretFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		mode os.FileMode
		uid  int // -1: leave
		err  string
	}{
		{"0600", 0o600, -1, ""},
		{"0400", 0o400, -1, ""},
		{"group readable", 0o640, -1, "has mode 0640: group or others may access it"},
		{"world readable", 0o644, -1, "has mode 0644"},
		{"group writable", 0o620, -1, "has mode 0620"},
		{"another owner", 0o600, 12345, "owned by uid 12345"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			writeSecret(t, p, "ops admin "+adminTok, tc.mode)
			if tc.uid >= 0 {
				if os.Geteuid() != 0 {
					t.Skip("needs root to chown")
				}
				if err := os.Chown(p, tc.uid, -1); err != nil {
					t.Fatal(err)
				}
			}
			_, err := LoadTokenFile(p)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), p)):
				t.Fatalf("err = %v, want %q naming %s", err, tc.err, p)
			}
		})
	}
	if _, err := LoadTokenFile(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a directory: %v", err)
	}
}

type countingObserver struct {
	mu       sync.Mutex
	failures map[string]int
	reloads  map[string]int
}

func (c *countingObserver) AuthFailure(r string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures[r]++
}

func (c *countingObserver) Reload(what string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok {
		c.reloads[what+" ok"]++
	} else {
		c.reloads[what+" failed"]++
	}
}

func newTestGuard(t *testing.T) (*Guard, string, *countingObserver, *bytes.Buffer) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	writeSecret(t, p, "ops admin "+adminTok+"\ndash read "+readTok+"\n", 0o600)
	obs := &countingObserver{failures: map[string]int{}, reloads: map[string]int{}}
	var logs bytes.Buffer
	g, err := NewGuard(GuardOptions{TokenFile: p, Open: []string{"/healthz", "/readyz"}, Observer: obs,
		Log: slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return g, p, obs, &logs
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func TestGuard(t *testing.T) {
	g, _, obs, logs := newTestGuard(t)
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := IdentityFrom(r.Context())
		_, _ = io.WriteString(w, "hello "+id.Name)
	}))
	tests := []struct {
		name, method, path, auth string
		status                   int
		body                     string
	}{
		{"no token", "GET", "/netlox/v1/config/loadbalancer/all", "", 401, `{"code":401,"message":"authentication required: send Authorization: Bearer <token>"}`},
		{"wrong scheme", "GET", "/netlox/v1/config/loadbalancer/all", "Basic " + adminTok, 401, ""},
		{"wrong token", "GET", "/netlox/v1/config/loadbalancer/all", "Bearer nope-nope-nope-nope-nope", 401, `{"code":401,"message":"the bearer token is not valid"}`},
		{"read token reads", "GET", "/netlox/v1/config/loadbalancer/all", "Bearer " + readTok, 200, "hello dash"},
		{"read token may not write", "POST", "/netlox/v1/config/loadbalancer", "Bearer " + readTok, 403, `{"code":403,"message":"token dash has role read; POST needs admin"}`},
		{"admin writes", "DELETE", "/netlox/v1/config/loadbalancer/externalipaddress/10.0.0.1/port/80/protocol/tcp", "bearer " + adminTok, 200, "hello ops"},
		{"probes need no token", "GET", "/readyz", "", 200, "hello"},
		{"metrics follow the API's auth", "GET", "/metrics", "", 401, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{"serviceArguments":{"externalIP":"10.0.0.9","port":8080}}`))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.body != "" && strings.TrimSpace(rec.Body.String()) != tc.body {
				t.Fatalf("body %q, want %q", rec.Body, tc.body)
			}
			if got := rec.Header().Get("WWW-Authenticate"); (tc.status == 401) != (got == `Bearer realm="kvgate"`) {
				t.Fatalf("WWW-Authenticate %q on %d", got, rec.Code)
			}
		})
	}
	if obs.failures["missing"] != 3 || obs.failures["invalid"] != 1 || obs.failures["forbidden"] != 1 {
		t.Fatalf("failures %v", obs.failures)
	}
	// Audit: one line per mutating call, with the token's name and the rule, never the token.
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "audit" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("audit lines: %v", lines)
	}
	if lines[0]["token"] != "-" || lines[0]["result"] != "unauthorized" || lines[0]["rule"] != "10.0.0.9:8080/tcp" {
		t.Errorf("refused POST audit: %v", lines[0])
	}
	if lines[1]["token"] != "ops" || lines[1]["rule"] != "10.0.0.1:80/tcp" || lines[1]["status"] != float64(200) || lines[1]["method"] != "DELETE" {
		t.Errorf("DELETE audit: %v", lines[1])
	}
	if strings.Contains(logs.String(), adminTok) || strings.Contains(logs.String(), readTok) {
		t.Fatal("a token reached the log")
	}
}

func TestGuardReload(t *testing.T) {
	g, path, obs, _ := newTestGuard(t)
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	status := func(tok string) int {
		req := httptest.NewRequest("GET", "/x", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	const newTok = "rotated-token-0123456789abcdef"
	writeSecret(t, path, "ops admin "+newTok+"\n", 0o600)
	g.Reload()
	if status(newTok) != 200 || status(adminTok) != 401 {
		t.Fatalf("after rotation: new %d, old %d", status(newTok), status(adminTok))
	}
	// A broken file keeps the tokens in force.
	writeSecret(t, path, "ops admin short\n", 0o600)
	g.Reload()
	if status(newTok) != 200 {
		t.Fatal("a broken token file replaced the tokens in force")
	}
	// So does a file that became world-readable.
	writeSecret(t, path, "ops admin "+adminTok+"\n", 0o644)
	g.Reload()
	if status(newTok) != 200 || status(adminTok) != 401 {
		t.Fatal("a world-readable token file was loaded")
	}
	if obs.reloads["tokens ok"] != 1 || obs.reloads["tokens failed"] != 2 {
		t.Fatalf("reloads %v", obs.reloads)
	}
}

func TestGuardOff(t *testing.T) {
	g, err := NewGuard(GuardOptions{})
	if err != nil || g.Enabled() {
		t.Fatalf("err %v enabled %v", err, g.Enabled())
	}
	rec := httptest.NewRecorder()
	g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})).ServeHTTP(rec, httptest.NewRequest("DELETE", "/x", nil))
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	if _, err := NewGuard(GuardOptions{TokenFile: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Fatal("a missing token file was accepted")
	}
}
