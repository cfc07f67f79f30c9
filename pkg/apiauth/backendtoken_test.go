package apiauth

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseBackendToken(t *testing.T) {
	tests := []struct {
		name, file, want, err string
	}{
		{"one line", "sk-engine-key\n", "sk-engine-key", ""},
		{"no newline", "sk-engine-key", "sk-engine-key", ""},
		{"first non-empty line, trimmed", "\n  \n\t sk-first \r\nsk-second\n", "sk-first", ""},
		{"CRLF", "sk-key\r\n", "sk-key", ""},
		{"empty", "", "", "no token"},
		{"blank lines only", "\n \n\t\n", "", "no token"},
		{"space inside", "sk key\n", "", "byte 2 of the token is a space"},
		{"control character", "sk\x01key", "", "byte 2 of the token"},
		{"non-ASCII", "sk-clé", "", "non-ASCII"},
		{"too long", strings.Repeat("k", MaxBackendTokenLen+1), "", "more than 4096"},
		{"longest", strings.Repeat("k", MaxBackendTokenLen), strings.Repeat("k", MaxBackendTokenLen), ""},
		{"file too large", strings.Repeat("k", MaxBackendTokenFileBytes+1), "", "more than 65536"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBackendToken([]byte(tc.file))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), "sk") && strings.Contains(tc.file, "sk") {
					t.Fatalf("the error quotes the token: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestLoadBackendTokenFileModes(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		mode os.FileMode
		err  string
	}{
		{"0600", 0o600, ""},
		{"0400", 0o400, ""},
		{"group-readable", 0o640, "has mode 0640: group or others may access it"},
		{"world-readable", 0o644, "has mode 0644"},
		{"group-writable", 0o620, "has mode 0620"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			writeSecret(t, path, "sk-engine-key\n", tc.mode)
			tok, err := LoadBackendTokenFile(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want %q naming %s", err, tc.err, path)
				}
				return
			}
			if err != nil || tok != "sk-engine-key" {
				t.Fatalf("got %q, %v", tok, err)
			}
		})
	}
	if _, err := LoadBackendTokenFile(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing file: err = %v", err)
	}
	if _, err := LoadBackendTokenFile(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("directory: err = %v", err)
	}
}

// fakeNow is a settable clock for BackendToken's poll interval.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time          { return f.t }
func (f *fakeNow) advance(d time.Duration) { f.t = f.t.Add(d) }
func newTestToken(t *testing.T, path string, log *slog.Logger) (*BackendToken, *fakeNow) {
	t.Helper()
	b, err := NewBackendToken(path, time.Second, log)
	clock := &fakeNow{t: time.Now()}
	b.now = clock.now
	b.checkedAt = clock.t
	if err != nil {
		t.Logf("first load: %v", err)
	}
	return b, clock
}

// TestBackendTokenReload follows one file through a rotation, a refused
// loosened mode and a refused empty version: the token in force changes only
// to a version that loads, only after the poll interval, and never reaches
// the log.
func TestBackendTokenReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine-key")
	writeSecret(t, path, "sk-old-key\n", 0o600)
	var logs bytes.Buffer
	b, clock := newTestToken(t, path, slog.New(slog.NewTextHandler(&logs, nil)))
	want := func(step, tok string, failing bool) {
		t.Helper()
		got, err := b.Token()
		if got != tok || (err != nil) != failing {
			t.Fatalf("%s: Token() = %q, %v; want %q (error: %v)", step, got, err, tok, failing)
		}
	}
	want("first load", "sk-old-key", false)

	writeSecret(t, path, "sk-new-key-longer\n", 0o600)
	want("before the interval", "sk-old-key", false)
	clock.advance(time.Second)
	want("rotated", "sk-new-key-longer", false)

	writeSecret(t, path, "sk-loose-key\n", 0o644)
	clock.advance(time.Second)
	want("loosened mode refused", "sk-new-key-longer", true)

	writeSecret(t, path, "\n", 0o600)
	clock.advance(time.Second)
	want("empty version refused", "sk-new-key-longer", true)

	writeSecret(t, path, "sk-fixed-key\n", 0o600)
	clock.advance(time.Second)
	want("fixed", "sk-fixed-key", false)

	if s := logs.String(); strings.Contains(s, "sk-") {
		t.Fatalf("a token reached the log:\n%s", s)
	} else if !strings.Contains(s, "has mode 0644") || !strings.Contains(s, "no token") {
		t.Fatalf("the refusals are not logged:\n%s", s)
	}
}

// TestBackendTokenBrokenAtStart: a file that fails its first load (as a
// restored rule's may) gives a BackendToken with no token that picks the
// file up once it is fixed.
func TestBackendTokenBrokenAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine-key")
	writeSecret(t, path, "sk-key\n", 0o644)
	b, clock := newTestToken(t, path, nil)
	if tok, err := b.Token(); tok != "" || err == nil || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("Token() = %q, %v; want none and the mode error", tok, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Second)
	if tok, err := b.Token(); tok != "sk-key" || err != nil {
		t.Fatalf("after chmod: Token() = %q, %v", tok, err)
	}
}

// FuzzParseBackendToken: any content gives a token fit for an HTTP header
// (printable ASCII, no space, bounded) or an error that does not quote the
// content; never a panic.
func FuzzParseBackendToken(f *testing.F) {
	for _, s := range []string{"sk-key\n", "\n\n  sk-key  \r\nsecond", "", "sk key", "sk\x00key", "\xff\xfe", strings.Repeat("k", MaxBackendTokenLen+1)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ParseBackendToken(b)
		if err != nil {
			if tok != "" {
				t.Fatalf("a token with an error: %q", tok)
			}
			return
		}
		if tok == "" || len(tok) > MaxBackendTokenLen {
			t.Fatalf("token of %d bytes", len(tok))
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] <= ' ' || tok[i] >= 0x7f {
				t.Fatalf("byte %d of the token is %#x", i, tok[i])
			}
		}
		if !bytes.Contains(b, []byte(tok)) {
			t.Fatalf("the token %q is not in the file", tok)
		}
	})
}

// TestBackendTokenSecretSwap follows a Kubernetes Secret update: the file is
// a symlink through ..data, and the update swaps ..data to a new directory.
func TestBackendTokenSecretSwap(t *testing.T) {
	dir := t.TempDir()
	for i, key := range []string{"sk-first", "sk-second"} {
		d := filepath.Join(dir, "v"+strconv.Itoa(i))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		writeSecret(t, filepath.Join(d, "engine-key"), key+"\n", 0o400)
	}
	if err := os.Symlink("v0", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "engine-key")
	if err := os.Symlink("..data/engine-key", path); err != nil {
		t.Fatal(err)
	}
	b, clock := newTestToken(t, path, nil)
	if tok, err := b.Token(); tok != "sk-first" || err != nil {
		t.Fatalf("first: %q %v", tok, err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink("v1", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Second)
	if tok, err := b.Token(); tok != "sk-second" || err != nil {
		t.Fatalf("after the swap: %q %v", tok, err)
	}
}
