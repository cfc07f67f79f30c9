package tlsterm

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// TestNewEngineTLSRefuses: a CA file that cannot serve is an error naming it.
func TestNewEngineTLSRefuses(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.crt")
	if err := os.WriteFile(junk, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.crt")
	if err := os.WriteFile(big, make([]byte, MaxCABytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, path, words string }{
		{"missing", filepath.Join(dir, "none.crt"), "no such file"},
		{"no PEM", junk, "holds no PEM certificate"},
		{"too large", big, "larger than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewEngineTLS(c.path)
			if err == nil || !strings.Contains(err.Error(), c.words) || !strings.Contains(err.Error(), c.path) {
				t.Fatalf("want an error naming %s with %q, got %v", c.path, c.words, err)
			}
		})
	}
	if e, err := NewEngineTLS(""); err != nil || e.roots() != nil {
		t.Fatalf("no CA file means the system's roots: %v", err)
	}
}

// TestEngineTLSConfig: what every engine connection of a security-2 rule
// asks for — the data-plane dialer and kvgate's own calls alike.
func TestEngineTLSConfig(t *testing.T) {
	ca, err := testcerts.NewCA("engines")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	e, err := NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ addr, serverName string }{
		{"10.0.0.2:8000", "10.0.0.2"},
		{"[fd00::2]:8000", "fd00::2"},
		{"engine.local:443", "engine.local"},
	}
	for _, c := range cases {
		cfg := e.ClientConfig(c.addr)
		if cfg.ServerName != c.serverName || cfg.MinVersion != tls.VersionTLS12 || cfg.InsecureSkipVerify ||
			len(cfg.NextProtos) != 1 || cfg.NextProtos[0] != "http/1.1" || cfg.RootCAs == nil || cfg.ClientSessionCache == nil {
			t.Errorf("%s: %+v", c.addr, cfg)
		}
	}
}

// TestEngineTLSFollowsCAFile: a replaced CA file is read at the next check
// (at most once per caCheckEvery); a broken replacement keeps the old pool.
func TestEngineTLSFollowsCAFile(t *testing.T) {
	first, _ := testcerts.NewCA("first")
	second, _ := testcerts.NewCA("second")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := first.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	e, err := NewEngineTLS(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := e.roots()
	touch := func(when time.Time) {
		if err := os.Chtimes(caFile, when, when); err != nil {
			t.Fatal(err)
		}
		e.mu.Lock()
		e.next = time.Time{}
		e.mu.Unlock()
	}
	if err := os.WriteFile(caFile, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	touch(time.Now().Add(time.Minute))
	if e.roots() != pool {
		t.Fatal("a CA file that does not parse replaced the pool in force")
	}
	if err := second.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	touch(time.Now().Add(2 * time.Minute))
	if got := e.roots(); got == pool || !got.Equal(second.Pool()) {
		t.Fatal("the replaced CA file was not followed")
	}
}
