package apiauth

// The backend token file: the key a rule's engines require (vLLM's
// --api-key), which kvgate sends on its own calls to them. It is a secret of
// the same kind as the API token file, held to the same mode and owner rules
// (CheckSecretFile), and reloaded when it changes. docs/security.md, "Engines
// that require a key".

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Bounds of a backend token file: one token, so a wrong path (a large file)
// costs at most MaxBackendTokenFileBytes to read.
const (
	MaxBackendTokenFileBytes = 64 << 10
	MaxBackendTokenLen       = 4096
)

// ParseBackendToken reads a backend token file's content: the token is the
// first non-empty line, trimmed of surrounding whitespace; later lines are
// ignored. It must be 1-MaxBackendTokenLen printable ASCII characters with no
// space, since it travels in an HTTP header. Errors never quote the token.
func ParseBackendToken(b []byte) (string, error) {
	if len(b) > MaxBackendTokenFileBytes {
		return "", fmt.Errorf("%d bytes, more than %d", len(b), MaxBackendTokenFileBytes)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 512), MaxBackendTokenFileBytes)
	for n := 1; sc.Scan(); n++ {
		tok := strings.TrimSpace(sc.Text())
		if tok == "" {
			continue
		}
		if len(tok) > MaxBackendTokenLen {
			return "", fmt.Errorf("line %d: the token is %d bytes, more than %d", n, len(tok), MaxBackendTokenLen)
		}
		if i := strings.IndexFunc(tok, func(c rune) bool { return c <= ' ' || c >= 0x7f }); i >= 0 {
			return "", fmt.Errorf("line %d: byte %d of the token is a space, a control or a non-ASCII character; the token goes in an HTTP header", n, i)
		}
		return tok, nil
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no token: the file has no non-empty line")
}

// LoadBackendTokenFile checks the file's mode and owner (CheckSecretFile),
// then reads its token. The error names the file and, for a mode problem,
// the mode.
func LoadBackendTokenFile(path string) (string, error) {
	if _, err := CheckSecretFile(path); err != nil {
		return "", fmt.Errorf("backend token file: %w", err)
	}
	b, err := readBounded(path, MaxBackendTokenFileBytes)
	if err != nil {
		return "", fmt.Errorf("backend token file %s: %w", path, err)
	}
	tok, err := ParseBackendToken(b)
	if err != nil {
		return "", fmt.Errorf("backend token file %s: %w", path, err)
	}
	return tok, nil
}

// BackendToken follows one backend token file. Token re-stats the file at
// most once per interval (size, mtime, inode, as the API token file's
// reload) and re-reads it when it changed, so a rotated key is sent without a
// restart. A version that fails to load (unreadable, loosened mode, no token)
// is refused: the token in force stays, and the failure is logged once per
// distinct error. Safe for concurrent use.
type BackendToken struct {
	path  string
	every time.Duration
	log   *slog.Logger
	now   func() time.Time

	mu        sync.Mutex
	token     string
	err       error // the last load's failure, nil after a success
	seen      fileStamp
	checkedAt time.Time
	loggedErr string
}

// NewBackendToken loads path once. A failed first load is returned as the
// error together with a usable BackendToken that holds no token yet and
// keeps trying every interval, so a rule restored with a broken file starts
// and picks the file up once it is fixed. every <= 0 means
// DefaultReloadInterval.
func NewBackendToken(path string, every time.Duration, log *slog.Logger) (*BackendToken, error) {
	if every <= 0 {
		every = DefaultReloadInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &BackendToken{path: path, every: every, log: log, now: time.Now}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reloadLocked(b.now())
	return b, b.err
}

// Path is the file followed.
func (b *BackendToken) Path() string { return b.path }

// Token is the token in force ("" when no version loaded yet) and the last
// load's error (nil when the file in force is the current one).
func (b *BackendToken) Token() (string, error) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.checkedAt) >= b.every {
		b.checkedAt = now
		if st, _ := stamp(b.path); st != b.seen || b.err != nil {
			b.reloadLocked(now)
		}
	}
	return b.token, b.err
}

func (b *BackendToken) reloadLocked(now time.Time) {
	b.checkedAt = now
	b.seen, _ = stamp(b.path)
	tok, err := LoadBackendTokenFile(b.path)
	if err != nil {
		b.err = err
		if msg := err.Error(); msg != b.loggedErr {
			b.loggedErr = msg
			b.log.Error("backend token file not loaded; the token in force stays", "file", b.path,
				"in_force", b.token != "", "err", err)
		}
		return
	}
	changed := tok != b.token
	b.token, b.err, b.loggedErr = tok, nil, ""
	if changed {
		b.log.Info("backend token file loaded", "file", b.path)
	}
}
