package enginesim

import "sync"

// outbox carries a request's step outputs from the engine loop to its HTTP
// handler. The loop must never block on a slow client, and a channel sized
// for the whole completion would allocate max_tokens slots per request up
// front; the outbox holds only what the handler has not taken yet (at most
// the tokens the loop produced since), so memory follows the stream.
type outbox struct {
	mu     sync.Mutex
	queue  []stepOutput
	signal chan struct{} // capacity 1: "something is queued"
}

func newOutbox() *outbox { return &outbox{signal: make(chan struct{}, 1)} }

// send queues o and wakes the handler; it never blocks.
func (b *outbox) send(o stepOutput) {
	b.mu.Lock()
	b.queue = append(b.queue, o)
	b.mu.Unlock()
	select {
	case b.signal <- struct{}{}:
	default:
	}
}

// take returns everything queued, oldest first (nil when nothing is).
func (b *outbox) take() []stepOutput {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queue
	b.queue = nil
	return q
}
