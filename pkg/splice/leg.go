//go:build linux

package splice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/pkg/datapath"
)

// noEndpoint marks a pair whose backend is not a registered endpoint.
const noEndpoint = 0xffffffff

// drainBound caps how long a finished leg waits for the kernel to hand the
// last redirected bytes to the client socket when no silence bound is set.
const drainBound = 30 * time.Second

// worth reports whether a body is worth splicing: streamed bodies, and
// bodies whose declared length reaches the threshold; under StreamedOnly
// (auto) token streams only.
func (d *Datapath) worth(opts datapath.Options) bool {
	if d.cfg.StreamedOnly {
		// auto: token streams only. Chunked framing alone does not make a
		// body a stream (a Go backend chunks any large JSON body), and bulk
		// moved faster through the userspace copy.
		return opts.TokenStream
	}
	if opts.Streamed || opts.TokenStream {
		return true
	}
	if d.cfg.Threshold < 0 {
		return true
	}
	return opts.ContentLength >= d.cfg.Threshold
}

// tcpSocket returns the raw connection of a plain TCP socket, or false for
// anything else (a TLS client, a pipe). kTLS seam: once TLS termination
// installs kTLS on the client socket, the client side can be passed here as
// its underlying *net.TCPConn (sockmap redirects into kTLS sockets); until
// then TLS clients stay on the userspace copy.
func tcpSocket(c net.Conn) (syscall.RawConn, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, false
	}
	rc, err := tc.SyscallConn()
	return rc, err == nil
}

// Run implements datapath.BodyLeg: it writes prefix, then moves the body in
// the kernel until the backend closes, the client goes away, the stream is
// silent for opts.Silence, or ctx ends. Small, non-TCP and tapped
// (opts.Tap) bodies take the userspace copy.
func (d *Datapath) Run(ctx context.Context, client, backend net.Conn, prefix []byte, opts datapath.Options) datapath.Result {
	crc, okc := tcpSocket(client)
	brc, okb := tcpSocket(backend)
	if !d.worth(opts) || opts.Tap != nil || !okc || !okb || d.closed.Load() {
		return d.user.Run(ctx, client, backend, prefix, opts)
	}
	res := datapath.Result{Path: d.Path(), LastActivity: time.Now()}
	// The body's end follows the bytes relayed in userspace (prefix and
	// drain); with their last bytes and the tail the BPF program keeps of
	// the redirected ones, it tells a complete body from a cut one
	// (docs/body-leg.md, "Broken responses"). A userspace copy that takes
	// the body over continues with the same opts.End.
	opts = opts.WithEnd()
	fr := opts.End
	var tail tailBuf
	// write relays the part of p that belongs to the body; false ends the
	// leg with res.Ending set.
	firstBody := opts.FirstBody
	write := func(p []byte) bool {
		p = p[:fr.Feed(p)]
		if len(p) > 0 && firstBody != nil {
			firstBody()
			firstBody = nil
		}
		n, err := client.Write(p)
		res.Bytes += int64(n)
		d.user.Count(int64(n))
		tail.add(p[:n])
		switch st := fr.State(); {
		case err != nil:
			res.Ending, res.Err = datapath.ClientGone, err
			return false
		case st.Err != nil:
			res.Ending, res.Err = datapath.BackendBroken, st.Err
			return false
		case st.Complete:
			res.Ending = datapath.BackendEOF
			return false
		}
		return true
	}
	if (len(prefix) > 0 || fr.State().Complete) && !write(prefix) {
		datapath.EndBroken(client, &res, fr)
		return res
	}

	// Empty the backend's receive queue before the splice starts. The
	// verdict path (tcp_read_skb) hands whole skbs to the program and
	// ignores how much of an skb userspace already read, so a partly read
	// skb left in the queue would be sent again. After a read that ends in
	// EAGAIN every queued skb was consumed whole and freed; anything that
	// arrives later is a fresh, unread skb.
	// The buffer goes back to its pool as soon as the drain is over: a
	// spliced response can last minutes, and 2,000 of them holding 64 KiB
	// each was half the heap in the soak (docs/body-leg.md, "Fault suite").
	buf := d.drainBuf()
	held := true
	release := func() {
		if held {
			held = false
			d.putDrainBuf(buf)
		}
	}
	defer release()
	for round := 0; ; round++ {
		n, state, err := drain(brc, *buf)
		if n > 0 && !write((*buf)[:n]) {
			datapath.EndBroken(client, &res, fr)
			return res
		}
		switch state {
		case drainEmpty:
		case drainEOF:
			res.Ending = datapath.BackendEOF
			if st := fr.State(); st.Delimited {
				res.Ending, res.Err = datapath.BackendBroken, fmt.Errorf("backend closed after %d body bytes: %w", st.Seen, io.ErrUnexpectedEOF)
			}
			datapath.EndBroken(client, &res, fr)
			return res
		case drainError:
			res.Ending, res.Err = datapath.BackendError, err
			datapath.EndBroken(client, &res, fr)
			return res
		case drainMore:
			if round < maxDrainRounds {
				continue
			}
			// The backend outruns us: stay in userspace for this body.
			release()
			r := d.user.Run(ctx, client, backend, nil, opts)
			r.Bytes += res.Bytes
			return r
		}
		break
	}
	release()
	if d.beforeInsert != nil {
		d.beforeInsert()
	}

	s, err := d.attach(crc, brc, backend.RemoteAddr())
	if err != nil {
		// Nothing was redirected: the userspace copy carries on, in order.
		// A backend that closed right after the drain can no longer join a
		// sockhash (EOPNOTSUPP outside ESTABLISHED): expected, not a warning.
		level := slog.LevelWarn
		if errors.Is(err, unix.EOPNOTSUPP) {
			level = slog.LevelDebug
		}
		d.log.Log(ctx, level, "sockmap attach failed; copying in userspace", "err", err)
		r := d.user.Run(ctx, client, backend, nil, opts)
		r.Bytes += res.Bytes
		return r
	}
	res, kernelTail := d.follow(ctx, s, client, backend, crc, res, opts)
	judgeEnd(client, &res, fr, &tail, kernelTail)
	return res
}

// judgeEnd decides, once a spliced body has ended, whether it ended by its
// framing: the body's end has followed the bytes relayed in userspace, and
// is told of the redirected ones by their count and the last bytes of the
// body (the userspace ones in user, then the tail the BPF program kept,
// kernelTail). A backend EOF before the end is BackendBroken; a broken body
// gets end.BrokenEnd (an event stream's final error event). The kernel
// cannot stop at the body's end, so bytes a backend sent past it make the
// tail incomplete too: the client connection is closed rather than left out
// of step with its responses.
func judgeEnd(client net.Conn, res *datapath.Result, end datapath.BodyEnd, user *tailBuf, kernelTail []byte) {
	if res.KernelBytes > 0 {
		t := *user
		t.add(kernelTail)
		end.Skip(res.KernelBytes, t.bytes(), end.State().Seen+res.KernelBytes <= tailLen)
	}
	if st := end.State(); res.Ending == datapath.BackendEOF && st.Delimited && !st.Complete {
		res.Ending, res.Err = datapath.BackendBroken, fmt.Errorf("backend closed after %d body bytes without the body's end: %w", res.Bytes, io.ErrUnexpectedEOF)
	}
	datapath.EndBroken(client, res, end)
}

// tailLen is the number of a body's last bytes the BPF program keeps
// (TAIL_LEN in bpf/splice.c).
const tailLen = int64(len(splicePair{}.Tail))

// tailBuf keeps the last tailLen bytes written.
type tailBuf struct {
	b [tailLen]byte
	n int
}

func (t *tailBuf) add(p []byte) {
	if len(p) >= len(t.b) {
		copy(t.b[:], p[len(p)-len(t.b):])
		t.n = len(t.b)
		return
	}
	keep := min(t.n, len(t.b)-len(p))
	copy(t.b[:keep], t.b[t.n-keep:t.n])
	copy(t.b[keep:], p)
	t.n = keep + len(p)
}

func (t *tailBuf) bytes() []byte { return t.b[:t.n] }

const (
	drainEmpty = iota // the receive queue is empty (EAGAIN)
	drainMore         // the buffer filled; more may be queued
	drainEOF          // the backend closed; the body is complete
	drainError        // the backend failed
)

// maxDrainRounds bounds the pre-splice drain against a backend that sends
// faster than the drain empties its queue.
const maxDrainRounds = 16

// drain reads the backend's receive queue without blocking into buf.
func drain(rc syscall.RawConn, buf []byte) (int, int, error) {
	n, state := 0, drainEmpty
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		for n < len(buf) {
			m, err := unix.Read(int(fd), buf[n:])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				state = drainEmpty
				return true
			case err != nil:
				state, rerr = drainError, err
				return true
			case m == 0:
				state = drainEOF
				return true
			}
			n += m
		}
		state = drainMore
		return true
	})
	if err != nil && rerr == nil {
		return n, drainError, err
	}
	return n, state, rerr
}

func (d *Datapath) drainBuf() *[]byte {
	d.drainHeld.Add(1)
	if b, ok := d.drainBufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 64<<10)
	return &b
}

func (d *Datapath) putDrainBuf(b *[]byte) {
	d.drainHeld.Add(-1)
	d.drainBufs.Put(b)
}

// clientWatch is the result of the goroutine that peeks at the client
// during a splice: done is closed once err (EOF, a reset, or the teardown's
// deadline) is set.
type clientWatch struct {
	done chan struct{}
	err  error
}

// session is one spliced response.
type session struct {
	clientCookie, backendCookie uint64
	clientFD                    int
	// crc is the client's raw connection: reads of its counters go through
	// it, so they fail on a closed client instead of reading a reused fd.
	crc syscall.RawConn
	// backendFD is kvgate's private duplicate of the backend socket, or -1.
	backendFD int
	// ended receives the ring buffer's end event for the backend.
	ended chan struct{}
	// base is the byte count the client socket had taken before the splice.
	base uint64
}

func (d *Datapath) attach(crc, brc syscall.RawConn, remote net.Addr) (*session, error) {
	s := &session{backendFD: -1, crc: crc}
	var err error
	if cerr := crc.Control(func(fd uintptr) {
		s.clientFD = int(fd)
		if s.clientCookie, err = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			err = fmt.Errorf("client SO_COOKIE: %w", err)
			return
		}
		s.base, err = writtenExact(int(fd))
	}); cerr != nil || err != nil {
		return nil, errors.Join(cerr, err)
	}
	if cerr := brc.Control(func(fd uintptr) {
		if s.backendCookie, err = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			err = fmt.Errorf("backend SO_COOKIE: %w", err)
		}
	}); cerr != nil || err != nil {
		return nil, errors.Join(cerr, err)
	}

	// Watch for the backend's end before the pair exists: sock_ops reports
	// state changes only for sockets with a pair.
	s.ended = d.ends.watch(s.backendCookie)
	p := splicePair{ClientCookie: s.clientCookie, Endpoint: d.endpointOf(remote)}
	if err := d.objs.Pairs.Update(s.backendCookie, &p, ebpf.UpdateNoExist); err != nil {
		d.ends.unwatch(s.backendCookie)
		return nil, fmt.Errorf("adding pair: %w", err)
	}
	// The client goes in first: once the backend is in its map, the verdict
	// program redirects to it.
	if err := d.objs.Clients.Update(s.clientCookie, uint64(s.clientFD), ebpf.UpdateNoExist); err != nil {
		_ = d.objs.Pairs.Delete(s.backendCookie)
		d.ends.unwatch(s.backendCookie)
		return nil, fmt.Errorf("adding client socket to sockhash: %w", err)
	}
	// The backend's fd must stay open while we insert it: Control holds it.
	if cerr := brc.Control(func(fd uintptr) {
		err = d.objs.Backends.Update(s.backendCookie, uint64(fd), ebpf.UpdateNoExist)
	}); cerr != nil || err != nil {
		_ = d.objs.Clients.Delete(s.clientCookie)
		_ = d.objs.Pairs.Delete(s.backendCookie)
		d.ends.unwatch(s.backendCookie)
		return nil, fmt.Errorf("adding backend socket to sockhash: %w", errors.Join(cerr, err))
	}
	// Take the backend socket out of Go's poller: every redirected chunk
	// still raises the socket's data_ready, and a registered fd would wake
	// kvgate per chunk for nothing. A private duplicate keeps the socket;
	// its end comes from the ring buffer. Without a duplicate (EMFILE) the
	// leg watches the backend through the poller instead.
	if cerr := brc.Control(func(fd uintptr) {
		s.backendFD, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); cerr != nil || err != nil {
		s.backendFD = -1
	}
	return s, nil
}

// follow waits for the spliced response to end and tears the splice down.
//
// Hand-over: bytes that reached the backend socket between the proxy's last
// read and the insertion sit in its receive queue, which the verdict does not
// see at insertion. The backend reader below reads right after insertion;
// with a verdict attached, recvmsg (tcp_bpf_recvmsg_parser) first runs the
// queued skbs through the verdict under the socket lock, so they are
// redirected before any later skb. Later arrivals run the whole queue in
// order too (tcp_read_skb). The reader then sees only EOF or an error.
// It also returns the last bytes the kernel redirected (at most tailLen).
func (d *Datapath) follow(ctx context.Context, s *session, client, backend net.Conn, crc syscall.RawConn, res datapath.Result, opts datapath.Options) (datapath.Result, []byte) {
	backendDone := watchBackend(s, backend)
	cw := watchClient(crc)

	var silence <-chan time.Time
	var timer *time.Timer
	if opts.Silence > 0 {
		timer = time.NewTimer(opts.Silence)
		defer timer.Stop()
		silence = timer.C
	}

	var endErr error
	ended := s.ended
	if s.backendFD < 0 {
		ended = nil // the poller-based reader reports the end itself
	}
loop:
	for {
		select {
		case err := <-backendDone:
			backendDone = nil
			res.Ending, endErr = backendEnding(ctx, err)
			break loop
		case <-ended:
			if err, ok := pollEnded(s.backendFD); ok {
				res.Ending, endErr = backendEnding(ctx, err)
				break loop
			}
		case <-cw.done:
			res.Ending, endErr = datapath.ClientGone, cw.err
			break loop
		case <-silence:
			last := d.lastActivity(s, res.LastActivity)
			if idle := time.Since(last); idle < opts.Silence {
				timer.Reset(opts.Silence - idle)
				continue
			}
			res.Ending = datapath.Silence
			break loop
		case <-ctx.Done():
			res.Ending = datapath.Cancelled
			break loop
		}
	}

	// The backend leaves the map first: no new redirects after this.
	_ = d.objs.Backends.Delete(s.backendCookie)
	var p splicePair
	_ = d.objs.Pairs.Lookup(s.backendCookie, &p)
	if res.Ending == datapath.BackendEOF {
		if err := d.waitDrained(ctx, s, p.Bytes, drainBoundFor(opts), cw); err != nil {
			res.Ending, endErr = datapath.ClientGone, err
			if ctx.Err() != nil {
				res.Ending = datapath.Cancelled
			}
		}
	}
	_ = d.objs.Pairs.Lookup(s.backendCookie, &p)
	_ = d.objs.Clients.Delete(s.clientCookie)
	_ = d.objs.Pairs.Delete(s.backendCookie)

	// Stop the watchers and wait for them, so nothing touches the
	// connections after Run returns.
	past := time.Unix(1, 0)
	d.ends.unwatch(s.backendCookie)
	if s.backendFD >= 0 {
		_ = unix.Close(s.backendFD)
	} else {
		_ = backend.SetReadDeadline(past)
		if backendDone != nil {
			<-backendDone
		}
	}
	_ = client.SetReadDeadline(past)
	<-cw.done
	_ = client.SetReadDeadline(time.Time{})

	res.KernelBytes = int64(p.Bytes)
	res.Bytes += int64(p.Bytes)
	if p.LastNs != 0 {
		res.LastActivity = monoToTime(p.LastNs)
	}
	if res.Ending == datapath.ClientGone || res.Ending == datapath.BackendError {
		res.Err = endErr
	}
	kept := min(p.Bytes, uint64(tailLen))
	return res, append([]byte(nil), p.Tail[uint64(tailLen)-kept:]...)
}

// pollEnded reads the backend after sock_ops reported that it left
// ESTABLISHED (FIN or RST). The read waits for the softirq that delivered it
// and runs anything still queued through the verdict first; a few retries
// cover the delivery still in progress.
func pollEnded(fd int) (error, bool) {
	for try := 0; try < 50; try++ {
		if err, ended := pollBackend(fd); ended {
			return err, true
		}
		time.Sleep(time.Millisecond)
	}
	return nil, false
}

// drainBoundFor bounds the final drain: the silence bound, else drainBound.
func drainBoundFor(opts datapath.Options) time.Duration {
	if opts.Silence > 0 {
		return opts.Silence
	}
	return drainBound
}

// watchBackend starts watching the backend side of a splice. With a
// private duplicate of the backend fd it closes the Go connection and does
// the hand-over kick (below); without one (EMFILE) a goroutine reads the
// backend through the poller. The channel gets the backend's end, if seen.
func watchBackend(s *session, backend net.Conn) chan error {
	backendDone := make(chan error, 1)
	if s.backendFD >= 0 {
		backend.Close() // deregisters the original fd; the duplicate keeps the socket
		// Kick: bytes queued between the drain and the insertion are run
		// through the verdict by this read (see follow); it also catches a
		// FIN that came with them.
		if err, ended := pollBackend(s.backendFD); ended {
			backendDone <- err
		}
		return backendDone
	}
	go func() {
		var b [512]byte
		for {
			n, err := backend.Read(b[:])
			if n > 0 {
				backendDone <- errBypass(n)
				return
			}
			if err != nil {
				backendDone <- err
				return
			}
		}
	}()
	return backendDone
}

// watchClient peeks at the client until it goes away (EOF, reset) or the
// teardown's read deadline. It reports once, by closing the watch's done:
// the follow loop and the final drain may both wait on it, and the
// teardown joins it (a one-shot channel send consumed by the drain left the
// teardown waiting forever; docs/body-leg.md, "Legs that never returned").
func watchClient(crc syscall.RawConn) *clientWatch {
	cw := &clientWatch{done: make(chan struct{})}
	go func() {
		var peek [1]byte
		var gone error
		err := crc.Read(func(fd uintptr) bool {
			n, _, rerr := unix.Recvfrom(int(fd), peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			switch {
			case rerr == unix.EAGAIN || rerr == unix.EINTR:
				return false
			case rerr != nil:
				gone = rerr
				return true
			case n == 0:
				gone = io.EOF
				return true
			}
			// The client sent its next request early: leave it queued.
			return false
		})
		if gone == nil {
			gone = err
		}
		cw.err = gone
		close(cw.done)
	}()
	return cw
}

// backendEnding classifies how the backend side ended.
func backendEnding(ctx context.Context, err error) (datapath.Ending, error) {
	switch {
	case errors.Is(err, io.EOF):
		return datapath.BackendEOF, nil
	case ctx.Err() != nil:
		return datapath.Cancelled, nil
	}
	return datapath.BackendError, err
}

// errBypass reports body bytes that reached userspace past the verdict:
// unreachable by construction (the pair exists before the backend enters
// the map, so the verdict never passes a byte to userspace).
func errBypass(n int) error { return fmt.Errorf("%d body bytes bypassed the splice", n) }

// pollBackend reads the backend duplicate without blocking: with the
// verdict attached it returns EOF, an error, or EAGAIN while streaming.
func pollBackend(fd int) (error, bool) {
	var b [512]byte
	for {
		n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_DONTWAIT)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil, false
		case err != nil:
			return err, true
		case n == 0:
			return io.EOF, true
		}
		return errBypass(n), true
	}
}

// waitDrained waits until the client socket has taken every byte the
// verdict redirected: redirects to egress are queued on the client's psock
// and sent by a kernel worker, and removing the client from the map before
// that would drop them.
//
// A cancelled ctx (the shutdown grace is over) ends the wait too.
func (d *Datapath) waitDrained(ctx context.Context, s *session, redirected uint64, bound time.Duration, cw *clientWatch) error {
	want := s.base + redirected
	deadline := time.Now().Add(bound)
	pause := 20 * time.Microsecond
	for {
		got, err := s.clientWritten()
		if err != nil {
			return fmt.Errorf("reading client socket counters: %w", err)
		}
		if got >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("client took %d of %d spliced bytes within %s", got-s.base, redirected, bound)
		}
		select {
		case <-cw.done:
			// A client that read everything and closed at once is not a
			// failure: its ACKs came before its FIN, so the counters
			// already show every byte taken.
			if got, err := s.clientWritten(); err == nil && got >= want {
				return nil
			}
			err := cw.err
			if err == nil {
				err = io.EOF
			}
			return fmt.Errorf("client went away with spliced bytes pending: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("cancelled with spliced bytes pending: %w", ctx.Err())
		case <-time.After(pause):
		}
		if pause < 5*time.Millisecond {
			pause *= 2
		}
	}
}

// clientWritten is written for the client socket, read while holding it.
func (s *session) clientWritten() (uint64, error) {
	var got uint64
	var err error
	if cerr := s.crc.Control(func(fd uintptr) { got, err = written(int(fd)) }); cerr != nil {
		return 0, fmt.Errorf("client socket: %w", cerr)
	}
	return got, err
}

// written is the number of bytes ever queued on a TCP socket for sending:
// bytes acknowledged plus bytes still in the send queue. Read in that order
// so a concurrent ACK can only make it an underestimate.
func written(fd int) (uint64, error) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, fmt.Errorf("TCP_INFO: %w", err)
	}
	outq, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		return 0, fmt.Errorf("SIOCOUTQ: %w", err)
	}
	return info.Bytes_acked + uint64(outq), nil
}

// writtenExact is written for a socket nobody writes to meanwhile: it
// retries until no ACK moved between the two reads. An underestimate here
// would let the drain check pass with redirected bytes still queued.
func writtenExact(fd int) (uint64, error) {
	for try := 0; ; try++ {
		a1, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return 0, fmt.Errorf("TCP_INFO: %w", err)
		}
		outq, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		if err != nil {
			return 0, fmt.Errorf("SIOCOUTQ: %w", err)
		}
		a2, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return 0, fmt.Errorf("TCP_INFO: %w", err)
		}
		if a1.Bytes_acked == a2.Bytes_acked {
			return a1.Bytes_acked + uint64(outq), nil
		}
		if try > 1000 {
			return 0, errors.New("client socket counters did not settle")
		}
	}
}

func (d *Datapath) lastActivity(s *session, floor time.Time) time.Time {
	var p splicePair
	if err := d.objs.Pairs.Lookup(s.backendCookie, &p); err != nil || p.LastNs == 0 {
		return floor
	}
	if t := monoToTime(p.LastNs); t.After(floor) {
		return t
	}
	return floor
}

// monoToTime converts a bpf_ktime_get_ns (CLOCK_MONOTONIC) stamp to wall time.
func monoToTime(ns uint64) time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(uint64(ts.Nano()) - ns))
}

// endpointOf maps a backend address to its endpoint index in the load map.
func (d *Datapath) endpointOf(a net.Addr) uint32 {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return noEndpoint
	}
	ap := ta.AddrPort()
	var idx uint32
	k := epKey(ap)
	if err := d.objs.Endpoints.Lookup(&k, &idx); err != nil {
		return noEndpoint
	}
	return idx
}

func epKey(ap netip.AddrPort) spliceEpKey {
	return spliceEpKey{Addr: ap.Addr().As16(), Port: uint32(ap.Port())}
}
