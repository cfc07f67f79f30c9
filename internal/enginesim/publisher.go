package enginesim

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevents"
)

// bufferedBatch is one published batch kept for replay.
type bufferedBatch struct {
	seq     uint64
	payload []byte
}

// publisher is vLLM's ZmqEventPublisher: a PUB socket sending
// [topic, seq (8 bytes big-endian, from 0), payload] per batch, and an
// optional ROUTER answering replay requests from a ring of the last
// bufferSteps batches.
type publisher struct {
	log    *slog.Logger
	topic  []byte
	layout kvevents.ReplayLayout
	pub    zmq4.Socket
	rtr    zmq4.Socket

	mu   sync.Mutex
	seq  uint64
	ring []bufferedBatch // circular, len <= cap
	head int             // index of the oldest entry once the ring is full

	pubAddr    net.Addr
	replayAddr net.Addr
	done       chan struct{}
}

// newPublisher binds the PUB socket at pubEP (and the ROUTER at replayEP
// unless it is "none"). An empty replayEP derives the default from the bound
// PUB port.
func newPublisher(log *slog.Logger, pubEP, replayEP, topic string, bufferSteps int, layout string) (*publisher, error) {
	zlog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	rl, err := kvevents.ParseReplayLayout(layout)
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	p := &publisher{
		log:    log,
		topic:  []byte(topic),
		layout: rl,
		ring:   make([]bufferedBatch, 0, bufferSteps),
		done:   make(chan struct{}),
	}
	p.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(zlog))
	if err := p.pub.SetOption(zmq4.OptionHWM, DefaultKVEventsHWM); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("kv events PUB: set HWM: %w", err)
	}
	if err := p.pub.Listen(listenEndpoint(pubEP)); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("kv events PUB: %w", err)
	}
	p.pubAddr = p.pub.Addr()
	if replayEP == "" {
		port := 0
		if ta, ok := p.pubAddr.(*net.TCPAddr); ok {
			port = ta.Port
		}
		replayEP = replayEndpointFor(pubEP, port)
	}
	if replayEP == "none" {
		close(p.done)
		return p, nil
	}
	p.rtr = zmq4.NewRouter(context.Background(), zmq4.WithLogger(zlog))
	if err := p.rtr.Listen(listenEndpoint(replayEP)); err != nil {
		p.pub.Close()
		p.rtr.Close()
		return nil, fmt.Errorf("kv events replay ROUTER: %w", err)
	}
	p.replayAddr = p.rtr.Addr()
	go p.serveReplay()
	return p, nil
}

// publish sends one encoded batch with the next sequence number and keeps it
// for replay.
func (p *publisher) publish(payload []byte) {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	if len(p.ring) < cap(p.ring) {
		p.ring = append(p.ring, bufferedBatch{seq, payload})
	} else {
		p.ring[p.head] = bufferedBatch{seq, payload}
		p.head = (p.head + 1) % len(p.ring)
	}
	p.mu.Unlock()
	// PUB never blocks on subscribers (HWM drops, as in libzmq).
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(kvevents.BuildMessage(p.topic, seq, payload)...)); err != nil {
		p.log.Warn("kv events: publish failed", "seq", seq, "err", err)
	}
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *publisher) since(start uint64) []bufferedBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]bufferedBatch, 0, len(p.ring))
	for i := range p.ring {
		b := p.ring[(p.head+i)%len(p.ring)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// serveReplay answers [identity, "", seq8] with one reply per buffered batch
// from that seq on, then the end marker, in the configured layout: current
// [identity, "", topic, seq8, payload] … [identity, "", "", ff*8, ""], or
// legacy [identity, "", seq8, payload] … [identity, "", ff*8, ""]. Other
// request shapes are ignored, as vLLM does.
func (p *publisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.rtr.Recv()
		if err != nil {
			return // socket closed
		}
		if len(msg.Frames) < 1 {
			continue
		}
		id := msg.Frames[0]
		start, err := kvevents.ParseReplayRequest(msg.Frames[1:])
		if err != nil {
			p.log.Debug("kv events replay: ignoring malformed request", "err", err)
			continue
		}
		for _, b := range p.since(start) {
			if err := p.rtr.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, kvevents.ReplayReply(p.layout, p.topic, b.seq, b.payload)...)...)); err != nil {
				p.log.Warn("kv events replay: send failed", "err", err)
				break
			}
		}
		if err := p.rtr.SendMulti(zmq4.NewMsgFrom(append([][]byte{id}, kvevents.ReplayEnd(p.layout)...)...)); err != nil {
			p.log.Warn("kv events replay: send end marker failed", "err", err)
		}
	}
}

func (p *publisher) close() error {
	err := p.pub.Close()
	if p.rtr != nil {
		if e := p.rtr.Close(); e != nil && err == nil {
			err = e
		}
	}
	<-p.done
	return err
}

// topics lists the topic prefixes connected subscribers asked for.
func (p *publisher) topics() []string {
	if t, ok := p.pub.(zmq4.Topics); ok {
		return t.Topics()
	}
	return nil
}
