package ingest

import (
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/zmtpguard/zmtptest"
)

// rawPeer is a TCP listener that speaks ZMTP by hand, so a test can send
// what no libzmq would. serve runs once per accepted connection.
type rawPeer struct {
	l     net.Listener
	mu    sync.Mutex
	n     int
	conns []net.Conn
}

func newRawPeer(t *testing.T, ip string, port int, serve func(c net.Conn, n int)) *rawPeer {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.n++
			n := p.n
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			go serve(c, n)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *rawPeer) accepted() int { p.mu.Lock(); defer p.mu.Unlock(); return p.n }

const hostileBound = 64 << 10

// hostileInputs are what a peer squatting on a KV port can send after (or
// instead of) a well-formed handshake. Each must cost the subscriber only its
// connection: the socket is rebuilt and the process lives.
var hostileInputs = []struct {
	name      string
	handshake bool   // send greeting + a valid READY first
	bytes     []byte // then these
}{
	{"long frame of 2^50 bytes", true, zmtptest.LongHeader(0, 1<<50)},
	{"long frame of 2^63-1 bytes", true, zmtptest.LongHeader(0x01, 1<<63-1)},
	{"frame one byte over the bound", true, zmtptest.LongHeader(0, hostileBound+1)},
	{"message over the bound", true, zmtptest.Message(make([]byte, 40<<10), make([]byte, 40<<10))},
	{"65 frames in one message", true, zmtptest.Message(make([][]byte, 65)...)},
	{"READY with a truncated property", false, append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x05abcde"))...)},
	{"READY with a property name past the end", false, append(zmtptest.Greeting(), zmtptest.Command([]byte("\x05READY\x09abc"))...)},
	{"READY with an unknown Socket-Type", false, append(zmtptest.Greeting(), zmtptest.Ready("BOGUS")...)},
	{"command of 1 MiB", false, append(zmtptest.Greeting(), zmtptest.LongHeader(0x04, 1<<20)...)},
}

func hostileTestOptions(rec *recorder) Options {
	opts := testOptions(rec)
	opts.MaxFrameBytes = hostileBound
	opts.DialTimeout = 300 * time.Millisecond
	return opts
}

func validBatch(t *testing.T, seq uint64, hashes ...uint64) []byte {
	t.Helper()
	b := &kvevents.Batch{TS: 1, Events: []kvevents.Event{{Type: kvevents.BlockStored, BlockHashes: hashes, BlockSize: 16}}}
	payload, err := kvevents.AppendEncode(nil, b, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return zmtptest.Message(kvevents.BuildMessage([]byte("kv-events"), seq, payload)...)
}

// TestHostilePublisher plays the PUB side: a well-formed batch, then the
// hostile bytes. Before zmtpguard, the 2^50 frame and the bad READY panicked
// the test binary inside zmq4's goroutines.
func TestHostilePublisher(t *testing.T) {
	for _, tc := range hostileInputs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ip := loopbackIP()
			port := freePort(t, ip)
			good := hashRange(100, 3)
			peer := newRawPeer(t, ip, port, func(c net.Conn, _ int) {
				if tc.handshake {
					if zmtptest.Handshake(c, "PUB") != nil {
						return
					}
					_, _ = c.Write(validBatch(t, 0, good...))
					time.Sleep(50 * time.Millisecond) // let the batch apply before the attack
				}
				_, _ = c.Write(tc.bytes)
			})
			ix, _ := inventory.New(inventory.Options{})
			rec := newRecorder()
			mgr := NewManager(hostileTestOptions(rec))
			defer mgr.Close()
			if err := mgr.Reconcile([]Target{{Service: 1, EPIdx: 0, IP: ip, Port: port, Ranks: 1, Inventory: ix}}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the subscriber to reconnect after the hostile peer", func() bool { return peer.accepted() >= 3 })
			if tc.handshake {
				if got := rec.get(func(r *recorder) int { return r.recvErrors }); got < 1 {
					t.Errorf("recv errors = %d, want ≥ 1 (the connection must be dropped)", got)
				}
				got := ix.Snapshot(0)
				slices.Sort(got)
				want := slices.Clone(good)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("inventory = %v, want the batch before the attack %v", got, want)
				}
			}
		})
	}
}

// TestHostileReplayRouter plays the replay ROUTER: the PUB side is honest,
// the replay socket answers the bootstrap request with the hostile bytes. The
// DEALER must fail the replay and the live stream must still apply.
func TestHostileReplayRouter(t *testing.T) {
	for _, tc := range hostileInputs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ip := loopbackIP()
			const offset = 1000
			port := freePort(t, ip, offset)
			good := hashRange(200, 2)
			newRawPeer(t, ip, port, func(c net.Conn, _ int) {
				if zmtptest.Handshake(c, "PUB") != nil {
					return
				}
				for range 50 { // until the subscription is in place
					if _, err := c.Write(validBatch(t, 0, good...)); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
			router := newRawPeer(t, ip, port+offset, func(c net.Conn, _ int) {
				if tc.handshake {
					if zmtptest.Handshake(c, "ROUTER") != nil {
						return
					}
					if _, err := zmtptest.ReadMessage(c); err != nil { // the replay request
						return
					}
				}
				_, _ = c.Write(tc.bytes)
			})
			ix, _ := inventory.New(inventory.Options{})
			rec := newRecorder()
			opts := hostileTestOptions(rec)
			opts.ReplayPortOffset = offset
			mgr := NewManager(opts)
			defer mgr.Close()
			if err := mgr.Reconcile([]Target{{Service: 1, EPIdx: 0, IP: ip, Port: port, Ranks: 1, Inventory: ix}}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a failed replay", func() bool {
				return router.accepted() >= 1 && rec.get(func(r *recorder) int {
					return r.replays["bootstrap/false"] + r.replays["gap/false"]
				}) >= 1
			})
			waitFor(t, "the live batch", func() bool { return len(ix.Snapshot(0)) == len(good) })
		})
	}
}
