package ingest

import (
	"context"
	"fmt"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// testPublisher plays a vLLM rank: a PUB socket sending [topic, seq, payload]
// batches built with the codec, a ROUTER answering replay requests from a
// bounded buffer (vLLM's buffer_steps), and the engine's own view of its
// cache, which the subscriber's inventory must converge to.
type testPublisher struct {
	t          testing.TB
	ip         string
	port       int
	replayPort int
	bufLen     int

	mu     sync.Mutex
	pub    zmq4.Socket
	router zmq4.Socket
	seq    uint64
	buf    []pubBatch
	cache  map[uint64]bool
	cancel context.CancelFunc
	done   chan struct{}
}

type pubBatch struct {
	seq     uint64
	payload []byte
}

// loopbackIP returns a random 127.x.y.z address, so parallel test packages
// can use fixed ports without colliding.
func loopbackIP() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(250))
}

// freePort returns a port free on ip such that port+span is free as well.
func freePort(t testing.TB, ip string, spans ...int) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		ok := true
		var extra []net.Listener
		for _, s := range spans {
			if p+s > 65535 {
				ok = false
				break
			}
			l2, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p+s)))
			if err != nil {
				ok = false
				break
			}
			extra = append(extra, l2)
		}
		for _, x := range extra {
			x.Close()
		}
		l.Close()
		if ok {
			return p
		}
	}
	t.Fatal("no free port pair")
	return 0
}

func newTestPublisher(t testing.TB, ip string, port, replayPort, bufLen int) *testPublisher {
	p := &testPublisher{t: t, ip: ip, port: port, replayPort: replayPort, bufLen: bufLen, cache: map[uint64]bool{}}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *testPublisher) start() {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(discardLogger()))
	if err := p.pub.Listen("tcp://" + net.JoinHostPort(p.ip, strconv.Itoa(p.port))); err != nil {
		p.t.Fatalf("publisher listen: %v", err)
	}
	p.done = make(chan struct{})
	if p.replayPort == 0 {
		close(p.done)
		return
	}
	p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(discardLogger()))
	if err := p.router.Listen("tcp://" + net.JoinHostPort(p.ip, strconv.Itoa(p.replayPort))); err != nil {
		p.t.Fatalf("replay listen: %v", err)
	}
	go p.serveReplay(p.router, p.done)
}

func (p *testPublisher) serveReplay(router zmq4.Socket, done chan struct{}) {
	defer close(done)
	for {
		msg, err := router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) < 1 {
			continue
		}
		id := msg.Frames[0]
		start, err := kvevents.ParseReplayRequest(msg.Frames[1:])
		if err != nil {
			continue // vLLM ignores other shapes
		}
		p.mu.Lock()
		var out []pubBatch
		for _, b := range p.buf {
			if b.seq >= start {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		for _, b := range out {
			if router.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, kvevents.ReplayReply(kvevents.ReplayLayoutCurrent, []byte("kv-events"), b.seq, b.payload)...)...)) != nil {
				break
			}
		}
		_ = router.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, kvevents.ReplayEnd(kvevents.ReplayLayoutCurrent)...)...))
	}
}

// stop closes the sockets (an engine going away).
func (p *testPublisher) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel == nil {
		return
	}
	p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
	p.cancel()
	p.cancel = nil
	<-p.done
}

// restart simulates an engine restart: a new process, sequence from 0, an
// empty cache and replay buffer.
func (p *testPublisher) restart() {
	p.stop()
	p.mu.Lock()
	p.seq, p.buf, p.cache = 0, nil, map[uint64]bool{}
	p.mu.Unlock()
	p.reopen()
}

// reopen binds the sockets again, keeping sequence, cache and buffer (the
// connection dropped, the engine did not restart). Call after stop.
func (p *testPublisher) reopen() {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := p.tryStart(); err == nil {
			return
		} else if time.Now().After(deadline) {
			p.t.Fatalf("restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *testPublisher) tryStart() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(discardLogger()))
	if err := pub.Listen("tcp://" + net.JoinHostPort(p.ip, strconv.Itoa(p.port))); err != nil {
		cancel()
		return err
	}
	done := make(chan struct{})
	var router zmq4.Socket
	if p.replayPort != 0 {
		router = zmq4.NewRouter(ctx, zmq4.WithLogger(discardLogger()))
		if err := router.Listen("tcp://" + net.JoinHostPort(p.ip, strconv.Itoa(p.replayPort))); err != nil {
			pub.Close()
			cancel()
			return err
		}
		go p.serveReplay(router, done)
	} else {
		close(done)
	}
	p.mu.Lock()
	p.pub, p.router, p.cancel, p.done = pub, router, cancel, done
	p.mu.Unlock()
	return nil
}

type pubOp struct {
	typ    kvevents.EventType
	hashes []uint64
}

// publish sends one batch of events under the next sequence number. With
// drop, the batch goes into the replay buffer but not on the wire, as if the
// subscriber had missed it.
func (p *testPublisher) publish(drop bool, ops ...pubOp) uint64 {
	p.t.Helper()
	b := &kvevents.Batch{TS: 1757500000.25, HasRank: true}
	for _, op := range ops {
		e := kvevents.Event{Type: op.typ, BlockHashes: op.hashes, BlockSize: 16, Medium: "GPU"}
		if op.typ == kvevents.BlockRemoved {
			e.HasGroupIdx = true
		}
		b.Events = append(b.Events, e)
	}
	payload, err := kvevents.AppendEncode(nil, b, kvevents.LayoutMap)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	for _, op := range ops {
		switch op.typ {
		case kvevents.BlockStored:
			for _, h := range op.hashes {
				p.cache[h] = true
			}
		case kvevents.BlockRemoved:
			for _, h := range op.hashes {
				delete(p.cache, h)
			}
		case kvevents.AllBlocksCleared:
			p.cache = map[uint64]bool{}
		}
	}
	p.buf = append(p.buf, pubBatch{seq: seq, payload: payload})
	if len(p.buf) > p.bufLen {
		p.buf = slices.Delete(p.buf, 0, len(p.buf)-p.bufLen)
	}
	if !drop {
		if err := p.pub.Send(zmq4.NewMsgFrom(kvevents.BuildMessage([]byte("kv-events"), seq, payload)...)); err != nil {
			p.t.Fatalf("publish %d: %v", seq, err)
		}
	}
	return seq
}

// setSeq makes the next batch carry sequence s (a jump, for gap tests).
func (p *testPublisher) setSeq(s uint64) {
	p.mu.Lock()
	p.seq = s
	p.mu.Unlock()
}

func (p *testPublisher) cached() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]uint64, 0, len(p.cache))
	for h := range p.cache {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

func stored(hs ...uint64) pubOp  { return pubOp{typ: kvevents.BlockStored, hashes: hs} }
func removed(hs ...uint64) pubOp { return pubOp{typ: kvevents.BlockRemoved, hashes: hs} }
func cleared() pubOp             { return pubOp{typ: kvevents.AllBlocksCleared} }

// hashRange returns n distinct hashes starting at base (spread over the
// 64-bit space, including values above 2^63).
func hashRange(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = (base+uint64(i))*0x9e3779b97f4a7c15 | 1
	}
	return out
}
