//go:build linux

package splice

import (
	"encoding/binary"
	"errors"
	"sync"

	"github.com/cilium/ebpf/ringbuf"
)

// endWatch delivers the kernel's "this spliced backend connection left
// ESTABLISHED" events (the `ends` ring buffer, written by sock_ops) to the
// leg waiting for that backend socket cookie. One goroutine reads the ring
// for the whole instance, so a streaming leg is not woken per chunk.
type endWatch struct {
	rd      *ringbuf.Reader
	mu      sync.Mutex
	waiters map[uint64]chan struct{}
	done    chan struct{}
}

func newEndWatch(d *Datapath) (*endWatch, error) {
	rd, err := ringbuf.NewReader(d.objs.Ends)
	if err != nil {
		return nil, err
	}
	w := &endWatch{rd: rd, waiters: map[uint64]chan struct{}{}, done: make(chan struct{})}
	go w.loop()
	return w, nil
}

func (w *endWatch) loop() {
	defer close(w.done)
	for {
		rec, err := w.rd.Read()
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			continue
		}
		if len(rec.RawSample) < 8 {
			continue
		}
		cookie := binary.NativeEndian.Uint64(rec.RawSample[:8])
		w.mu.Lock()
		if ch, ok := w.waiters[cookie]; ok {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}

// watch registers interest in cookie; the channel receives once per event.
func (w *endWatch) watch(cookie uint64) chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.waiters[cookie] = ch
	w.mu.Unlock()
	return ch
}

func (w *endWatch) unwatch(cookie uint64) {
	w.mu.Lock()
	delete(w.waiters, cookie)
	w.mu.Unlock()
}

func (w *endWatch) close() error {
	err := w.rd.Close()
	<-w.done
	return err
}
