// Package state persists kvgate's load-balancer rules to --state-dir so they
// survive a restart.
//
// Writes are atomic and durable: the new state goes to a temporary file in the
// same directory, is fsynced, the current file is kept as the previous
// generation (rules.json.prev), the temporary file is renamed over rules.json
// and the directory is fsynced. Every file carries a SHA-256 of its payload,
// so a torn or truncated file is detected on load, set aside as
// rules.json.corrupt-<time>, and the previous generation is restored. A crash
// at any point of a write therefore leaves either the old or the new state.
package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
)

// DefaultDir is the default --state-dir.
const DefaultDir = "/var/lib/kvgate"

const (
	fileName   = "rules.json"
	prevSuffix = ".prev"
	tmpPrefix  = ".rules.json.tmp-"
	format     = "kvgate-rules/1"
	// maxFileSize bounds what Load reads: 4096 rules of 256 endpoints fit well below it.
	maxFileSize = 256 << 20
)

// envelope is the file format: the payload with its checksum.
type envelope struct {
	Format string          `json:"format"`
	SHA256 string          `json:"sha256"`
	Saved  time.Time       `json:"saved"`
	Rules  json.RawMessage `json:"rules"`
}

// Store reads and writes the rule state in one directory.
type Store struct {
	dir string
	log *slog.Logger
	mu  sync.Mutex
	// curGood records that rules.json is known to be a good generation (this
	// store wrote it or loaded it), so Save need not re-read it.
	curGood bool
}

// Open creates dir if missing (mode 0700) and returns a store for it.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if dir == "" {
		return nil, errors.New("state: empty directory")
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state: create %s: %w", dir, err)
	}
	return &Store{dir: dir, log: log}, nil
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// Path is the current state file.
func (s *Store) Path() string { return filepath.Join(s.dir, fileName) }

// Save writes rules atomically and durably.
func (s *Store) Save(rules []config.Rule) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rules == nil {
		rules = []config.Rule{}
	}
	payload, err := json.Marshal(rules)
	if err != nil {
		return fmt.Errorf("state: encode rules: %w", err)
	}
	sum := sha256.Sum256(payload)
	// Compact, so the payload bytes on disk are exactly the checksummed ones.
	doc, err := json.Marshal(envelope{Format: format, SHA256: hex.EncodeToString(sum[:]), Saved: time.Now().UTC(), Rules: payload})
	if err != nil {
		return fmt.Errorf("state: encode file: %w", err)
	}
	doc = append(doc, '\n')

	tmp, err := os.CreateTemp(s.dir, tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("state: create temporary file in %s: %w", s.dir, err)
	}
	tmpName := tmp.Name()
	cleanup := func() { _ = os.Remove(tmpName) }
	if _, err := tmp.Write(doc); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("state: write %s: %w", tmpName, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("state: fsync %s: %w", tmpName, err)
	}
	if err := tmp.Close(); err != nil {
		cleanup()
		return fmt.Errorf("state: close %s: %w", tmpName, err)
	}
	cur := s.Path()
	// Keep the current generation as the previous one, but only if it is
	// good: a corrupt current file must never replace a good previous one.
	if !s.curGood {
		_, err := readFile(cur)
		s.curGood = err == nil
	}
	if s.curGood {
		if err := os.Rename(cur, cur+prevSuffix); err != nil {
			cleanup()
			return fmt.Errorf("state: keep previous generation: %w", err)
		}
	}
	if err := os.Rename(tmpName, cur); err != nil {
		cleanup()
		s.curGood = false
		return fmt.Errorf("state: rename %s to %s: %w", tmpName, cur, err)
	}
	s.curGood = true
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("state: fsync %s: %w", s.dir, err)
	}
	return nil
}

// Load returns the saved rules: the current file, or the previous generation
// when the current one is missing or corrupt. No state at all is an empty
// list. An error means neither generation could be read; the files are left
// in place for the operator.
func (s *Store) Load() ([]config.Rule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeStaleTemps()
	cur := s.Path()
	rules, curErr := readFile(cur)
	s.curGood = curErr == nil
	if curErr == nil {
		return rules, nil
	}
	curMissing := errors.Is(curErr, fs.ErrNotExist)
	prev, prevErr := readFile(cur + prevSuffix)
	prevMissing := errors.Is(prevErr, fs.ErrNotExist)
	switch {
	case curMissing && prevMissing:
		return []config.Rule{}, nil
	case prevErr == nil:
		if !curMissing {
			s.log.Warn("state file is corrupt; restoring the previous generation", "file", cur, "err", curErr)
			s.quarantine(cur)
		} else {
			s.log.Warn("state file missing; restoring the previous generation (a write was interrupted)", "file", cur)
		}
		// Make the restored generation current again, so the next Save keeps it as prev.
		if err := os.Rename(cur+prevSuffix, cur); err == nil {
			_ = syncDir(s.dir)
			s.curGood = true
		}
		return prev, nil
	case curMissing:
		return nil, fmt.Errorf("state: %s is missing and %s is unreadable: %w", cur, cur+prevSuffix, prevErr)
	default:
		return nil, fmt.Errorf("state: %s is unreadable (%w) and no good previous generation exists (%w)", cur, curErr, prevErr)
	}
}

func (s *Store) quarantine(path string) {
	to := fmt.Sprintf("%s.corrupt-%s", path, time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Rename(path, to); err != nil {
		s.log.Error("cannot set the corrupt state file aside", "file", path, "err", err)
		return
	}
	s.log.Warn("corrupt state file kept for inspection", "file", to)
}

func (s *Store) removeStaleTemps() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			_ = os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

// readFile reads and verifies one state file.
func readFile(path string) ([]config.Rule, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if n > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	var env envelope
	if err := json.Unmarshal(buf.Bytes(), &env); err != nil {
		return nil, fmt.Errorf("%s: not a complete state file: %w", path, err)
	}
	if env.Format != format {
		return nil, fmt.Errorf("%s: unknown format %q (want %q)", path, env.Format, format)
	}
	sum := sha256.Sum256(env.Rules)
	if hex.EncodeToString(sum[:]) != env.SHA256 {
		return nil, fmt.Errorf("%s: checksum mismatch (torn write)", path)
	}
	var rules []config.Rule
	if err := json.Unmarshal(env.Rules, &rules); err != nil {
		return nil, fmt.Errorf("%s: rules: %w", path, err)
	}
	if rules == nil {
		rules = []config.Rule{}
	}
	return rules, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
