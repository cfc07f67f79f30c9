package rulesfile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
)

// Reload results, the values of kvgate_rules_file_reloads_total{result}.
const (
	// ResultOK: the table matches the file.
	ResultOK = "ok"
	// ResultInvalid: the file could not be read or a rule failed its checks;
	// nothing changed.
	ResultInvalid = "invalid"
	// ResultPartial: the file is valid but the daemon refused some changes
	// (a port in use); those rules stay as they were and are retried.
	ResultPartial = "partial"
)

// Interval bounds (--rules-file-interval).
const (
	DefaultInterval = 2 * time.Second
	MinInterval     = 100 * time.Millisecond
	MaxInterval     = 5 * time.Minute
)

// Applier installs a parsed file (*api.Server implements it).
type Applier interface {
	ReconcileFile(source string, rules []api.FileRule) (api.ReconcileResult, error)
}

// Observer is told the result of every reload (the daemon wires it to
// kvgate_rules_file_*).
type Observer interface {
	RulesFileReload(result string, rules int, at time.Time)
}

// Options configure a Watcher.
type Options struct {
	// Path is the rules file. A ConfigMap mount replaces it through a symlink
	// swap; the watcher follows the path, not an inode.
	Path string
	// Interval is how often the file is checked; 0 means DefaultInterval.
	Interval time.Duration
	// Settings validate the rules as a POST would.
	Settings config.Settings
	// Getenv resolves ${NAME} references; nil means os.LookupEnv.
	Getenv   func(string) (string, bool)
	Apply    Applier
	Observer Observer
	Log      *slog.Logger
}

// Watcher reconciles the rule table with a rules file.
type Watcher struct {
	opts Options
	log  *slog.Logger
	// last is the content last reconciled, and whether that reconcile left
	// something to retry (a partial apply).
	last      [sha256.Size]byte
	haveLast  bool
	retry     bool
	lastStamp stamp
}

// stamp is what a cheap stat says about the file; a change means a read.
type stamp struct {
	mod  time.Time
	size int64
}

// New checks opts; call Reload once, then Run.
func New(opts Options) (*Watcher, error) {
	if opts.Path == "" {
		return nil, errors.New("rules file: no path")
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Interval < MinInterval || opts.Interval > MaxInterval {
		return nil, fmt.Errorf("--rules-file-interval=%s: want %s-%s", opts.Interval, MinInterval, MaxInterval)
	}
	if opts.Apply == nil {
		return nil, errors.New("rules file: no applier")
	}
	if opts.Getenv == nil {
		opts.Getenv = os.LookupEnv
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Watcher{opts: opts, log: opts.Log}, nil
}

// Reload reads the file and reconciles the table with it now. An invalid
// file changes nothing: the error names the rule and the field.
func (w *Watcher) Reload() error {
	st, data, err := w.read()
	if err != nil {
		w.record(ResultInvalid, 0, err)
		return err
	}
	w.lastStamp = st
	return w.reconcile(data)
}

func (w *Watcher) reconcile(data []byte) error {
	sum := sha256.Sum256(data)
	w.last, w.haveLast, w.retry = sum, true, false
	rules, err := Parse(data, w.opts.Settings, w.opts.Getenv)
	if err != nil {
		err = fmt.Errorf("rules file %s: %w", w.opts.Path, err)
		w.record(ResultInvalid, 0, err)
		return err
	}
	res, err := w.opts.Apply.ReconcileFile(w.opts.Path, rules)
	switch {
	case err == nil:
		w.log.Info("rules file reconciled", "file", w.opts.Path, "rules", len(rules), "created", res.Created,
			"updated", res.Updated, "deleted", res.Deleted, "unchanged", res.Unchanged)
		w.record(ResultOK, len(rules), nil)
		return nil
	case !res.Checked:
		err = fmt.Errorf("rules file %s: %w", w.opts.Path, err)
		w.record(ResultInvalid, 0, err)
		return err
	}
	w.retry = true
	err = fmt.Errorf("rules file %s: some rules were not applied (retried every %s): %w", w.opts.Path, w.opts.Interval, err)
	w.record(ResultPartial, len(rules), err)
	return err
}

func (w *Watcher) record(result string, rules int, err error) {
	if err != nil {
		w.log.Error("rules file not applied; the rule table keeps its last good state", "file", w.opts.Path, "result", result, "err", err)
	}
	if w.opts.Observer != nil {
		w.opts.Observer.RulesFileReload(result, rules, time.Now())
	}
}

// read stats and reads the file, bounded by MaxFileBytes.
func (w *Watcher) read() (stamp, []byte, error) {
	f, err := os.Open(w.opts.Path)
	if err != nil {
		return stamp{}, nil, fmt.Errorf("rules file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return stamp{}, nil, fmt.Errorf("rules file: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return stamp{}, nil, fmt.Errorf("rules file %s: %w", w.opts.Path, err)
	}
	if len(data) > MaxFileBytes {
		return stamp{}, nil, fmt.Errorf("rules file %s: larger than %d bytes", w.opts.Path, MaxFileBytes)
	}
	return stamp{mod: fi.ModTime(), size: fi.Size()}, data, nil
}

// Run checks the file every Interval until ctx ends: a changed file is
// reconciled, and a partial apply is retried.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.Check()
	}
}

// Check runs one poll: a stat, and a read and reconcile when the file
// changed (or the last apply is to be retried).
func (w *Watcher) Check() {
	fi, err := os.Stat(w.opts.Path)
	if err == nil && !w.retry && w.haveLast && (stamp{mod: fi.ModTime(), size: fi.Size()}) == w.lastStamp {
		return
	}
	st, data, err := w.read()
	if err != nil {
		if w.lastStamp != (stamp{}) { // report a vanished or unreadable file once
			w.lastStamp = stamp{}
			w.record(ResultInvalid, 0, err)
		}
		return
	}
	w.lastStamp = st
	if sum := sha256.Sum256(data); !w.retry && w.haveLast && bytes.Equal(sum[:], w.last[:]) {
		return // touched, same content
	}
	_ = w.reconcile(data)
}
