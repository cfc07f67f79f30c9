package datapath

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Userspace is the portable body leg: a copy loop in kvgate's own process.
// Make one with NewUserspace and share it; it is safe for concurrent use.
type Userspace struct {
	buffers sync.Pool
	// moved counts every body byte this leg wrote to clients, for
	// kvgate_spliced_bytes_total{path="userspace"}.
	moved atomic.Uint64
}

// NewUserspace returns a userspace body leg whose copy buffers are bufSize
// bytes (32 KiB when bufSize ≤ 0).
func NewUserspace(bufSize int) *Userspace {
	if bufSize <= 0 {
		bufSize = 32 << 10
	}
	u := &Userspace{}
	u.buffers.New = func() any { b := make([]byte, bufSize); return &b }
	return u
}

// Path implements BodyLeg.
func (*Userspace) Path() string { return "userspace" }

// Run implements BodyLeg. Each read from the backend carries a deadline of
// opts.Silence, so a silent stream ends instead of hanging; a cancelled
// context unblocks the copy by expiring both connections' deadlines.
func (u *Userspace) Run(ctx context.Context, client, backend net.Conn, prefix []byte, opts Options) (res Result) {
	res = Result{Path: u.Path(), LastActivity: time.Now()}
	defer func() { u.moved.Add(uint64(res.Bytes)) }()
	if len(prefix) > 0 {
		n, err := client.Write(prefix)
		res.Bytes += int64(n)
		if err != nil {
			res.Ending, res.Err = ClientGone, err
			return res
		}
	}

	stop := context.AfterFunc(ctx, func() {
		past := time.Unix(1, 0)
		_ = backend.SetReadDeadline(past)
		_ = client.SetWriteDeadline(past)
	})
	defer stop()

	buf := u.buffers.Get().(*[]byte)
	defer u.buffers.Put(buf)

	for {
		if opts.Silence > 0 {
			_ = backend.SetReadDeadline(time.Now().Add(opts.Silence))
		}
		n, rerr := backend.Read(*buf)
		if n > 0 {
			w, werr := client.Write((*buf)[:n])
			res.Bytes += int64(w)
			res.LastActivity = time.Now()
			if werr != nil {
				res.Ending, res.Err = ClientGone, werr
				if ctx.Err() != nil {
					res.Ending = Cancelled
				}
				return res
			}
		}
		if rerr == nil {
			continue
		}
		switch {
		case errors.Is(rerr, io.EOF):
			res.Ending = BackendEOF
		case ctx.Err() != nil:
			res.Ending = Cancelled
		case errors.Is(rerr, os.ErrDeadlineExceeded):
			res.Ending = Silence
		default:
			res.Ending, res.Err = BackendError, rerr
		}
		// The client keeps no stale deadline for its next request.
		_ = client.SetWriteDeadline(time.Time{})
		return res
	}
}

// Stats implements StatsReporter.
func (u *Userspace) Stats() Stats {
	return Stats{Path: u.Path(), Moved: map[string]uint64{u.Path(): u.moved.Load()}}
}

// Count records n body bytes written to a client in userspace by another
// leg (the sockmap leg's prefixes and small bodies), so
// kvgate_spliced_bytes_total{path="userspace"} covers them.
func (u *Userspace) Count(n int64) {
	if n > 0 {
		u.moved.Add(uint64(n))
	}
}
