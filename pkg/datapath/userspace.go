package datapath

import (
	"context"
	"errors"
	"fmt"
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
// context unblocks the copy by expiring both connections' deadlines. The
// body's end is opts.End's: the leg ends at the body's last byte, and a
// backend EOF before it is BackendBroken. A leg that started the body
// itself (the kernel leg's prefix and pre-splice drain) hands it on by
// passing the same opts.End, already fed.
func (u *Userspace) Run(ctx context.Context, client, backend net.Conn, prefix []byte, opts Options) (res Result) {
	opts = opts.WithEnd()
	fr := opts.End
	res = Result{Path: u.Path(), LastActivity: time.Now()}
	defer func() { u.moved.Add(uint64(res.Bytes)) }()
	// relay writes the part of p that belongs to the body; it reports
	// false when the leg is over (client gone, body complete, bad framing).
	firstBody := opts.FirstBody
	relay := func(p []byte) bool {
		n := fr.Feed(p)
		if n > 0 && firstBody != nil {
			firstBody()
			firstBody = nil
		}
		if n > 0 {
			w, err := client.Write(p[:n])
			res.Bytes += int64(w)
			if opts.Tap != nil && w > 0 {
				opts.Tap(p[:w])
			}
			res.LastActivity = time.Now()
			if err != nil {
				res.Ending, res.Err = ClientGone, err
				if ctx.Err() != nil {
					res.Ending = Cancelled
				}
				return false
			}
		}
		switch st := fr.State(); {
		case st.Err != nil:
			res.Ending, res.Err = BackendBroken, st.Err
			return false
		case st.Complete:
			res.Ending = BackendEOF
			return false
		}
		return true
	}
	if (len(prefix) > 0 || fr.State().Complete) && !relay(prefix) {
		EndBroken(client, &res, fr)
		return res
	}

	stop := context.AfterFunc(ctx, func() {
		past := time.Unix(1, 0)
		_ = backend.SetReadDeadline(past)
		_ = client.SetWriteDeadline(past)
	})
	defer stop()
	// A client that leaves while the backend is silent wakes the read.
	cw := watchClient(client, func() { _ = backend.SetReadDeadline(time.Unix(1, 0)) })
	defer cw.stop()

	buf := u.buffers.Get().(*[]byte)
	defer u.buffers.Put(buf)
	if ending, err, byRead := u.copyBody(ctx, backend, *buf, opts, cw, relay); byRead {
		res.Ending, res.Err = ending, err
	}
	stop()
	// The client keeps no stale deadline for its next request.
	_ = client.SetWriteDeadline(time.Time{})
	EndBroken(client, &res, fr)
	return res
}

// copyBody reads the backend into relay until the body ends. byRead is
// false when relay ended the leg (it set the ending itself); otherwise the
// read's ending is returned.
func (u *Userspace) copyBody(ctx context.Context, backend net.Conn, buf []byte, opts Options,
	cw *clientWatch, relay func([]byte) bool) (ending Ending, err error, byRead bool) {
	for {
		if opts.Silence > 0 {
			_ = backend.SetReadDeadline(time.Now().Add(opts.Silence))
		}
		if cw.left() {
			// The watch fired while the silence deadline was being set.
			_ = backend.SetReadDeadline(time.Unix(1, 0))
		}
		n, rerr := backend.Read(buf)
		if n > 0 && !relay(buf[:n]) {
			return 0, nil, false
		}
		if rerr != nil {
			ending, err = readEnding(ctx, rerr, opts.End.State(), cw)
			return ending, err, true
		}
	}
}

// readEnding classifies a backend read error that ended the copy.
func readEnding(ctx context.Context, rerr error, body BodyState, cw *clientWatch) (Ending, error) {
	switch {
	case errors.Is(rerr, os.ErrDeadlineExceeded) && ctx.Err() == nil && cw.stop():
		return ClientGone, errClientLeft
	case errors.Is(rerr, io.EOF) && body.Delimited:
		return BackendBroken, fmt.Errorf("backend closed after %d body bytes: %w", body.Seen, io.ErrUnexpectedEOF)
	case errors.Is(rerr, io.EOF):
		return BackendEOF, nil
	case ctx.Err() != nil:
		return Cancelled, nil
	case errors.Is(rerr, os.ErrDeadlineExceeded):
		return Silence, nil
	}
	return BackendError, rerr
}

// errClientLeft is the error of a leg whose client went away while the
// backend was silent.
var errClientLeft = errors.New("the client closed its connection while the backend was silent")

// errorEventBound bounds the write of the final error event.
const errorEventBound = 2 * time.Second

// EndBroken writes end.BrokenEnd to the client when the body ended on the
// backend's side without its end (BackendBroken, BackendError, Silence) and
// end has bytes for that (an event stream stopped at an event boundary
// gets a final error event). Both legs use it; the client connection is
// closed by the proxy afterwards.
func EndBroken(client net.Conn, res *Result, end BodyEnd) {
	var why string
	switch res.Ending {
	case BackendBroken:
		why = "the model server closed the stream before its end"
	case BackendError:
		why = "the model server connection failed mid-stream"
	case Silence:
		why = "the model server stream fell silent"
	default:
		return
	}
	last := end.BrokenEnd(why)
	if last == nil {
		return
	}
	_ = client.SetWriteDeadline(time.Now().Add(errorEventBound))
	if _, err := client.Write(last); err == nil {
		res.ErrorEvent = true
	}
	_ = client.SetWriteDeadline(time.Time{})
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
