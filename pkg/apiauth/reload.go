package apiauth

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
)

// DefaultReloadInterval is how often watched files are checked for changes.
// Polling (size, mtime, inode) also follows Kubernetes Secret updates, which
// swap a symlink rather than write the file.
const DefaultReloadInterval = 2 * time.Second

// fileStamp identifies a file version.
type fileStamp struct {
	size  int64
	mtime time.Time
	ino   uint64
}

func stamp(path string) (fileStamp, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, false
	}
	return fileStamp{size: fi.Size(), mtime: fi.ModTime(), ino: inode(fi)}, true
}

// watched reloads a value from files when any of them changes. The value in
// force is replaced only by one that loaded without error.
type watched[T any] struct {
	what  string
	paths []string
	load  func() (T, error)
	cur   atomic.Pointer[T]
	seen  []fileStamp
	obs   Observer
	log   *slog.Logger
}

func newWatched[T any](what string, paths []string, load func() (T, error), obs Observer, log *slog.Logger) (*watched[T], error) {
	w := &watched[T]{what: what, paths: paths, load: load, obs: obs, log: log}
	v, err := load()
	if err != nil {
		return nil, err
	}
	w.cur.Store(&v)
	w.seen = w.stamps()
	return w, nil
}

func (w *watched[T]) stamps() []fileStamp {
	out := make([]fileStamp, len(w.paths))
	for i, p := range w.paths {
		out[i], _ = stamp(p)
	}
	return out
}

func (w *watched[T]) get() T { return *w.cur.Load() }

// check reloads when a file changed; it reports whether a new value is in force.
func (w *watched[T]) check() bool {
	now := w.stamps()
	changed := false
	for i := range now {
		if now[i] != w.seen[i] {
			changed = true
		}
	}
	if !changed {
		return false
	}
	w.seen = now
	v, err := w.load()
	if err != nil {
		w.obs.Reload(w.what, false)
		w.log.Error("reload failed; the previous version stays in force", "what", w.what, "err", err)
		return false
	}
	w.cur.Store(&v)
	w.obs.Reload(w.what, true)
	w.log.Info("reloaded", "what", w.what)
	return true
}

func (w *watched[T]) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check()
		}
	}
}
