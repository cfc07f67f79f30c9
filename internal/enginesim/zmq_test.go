package enginesim

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// subscribe connects a SUB socket and waits until the engine sees it.
func subscribe(t *testing.T, e *Engine) zmq4.Socket {
	t.Helper()
	sub := zmq4.NewSub(context.Background())
	t.Cleanup(func() { sub.Close() })
	if err := sub.Dial(e.EventsEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.EventSubscriptions()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("subscription never reached the engine")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return sub
}

type recvBatch struct {
	seq   uint64
	raw   []byte
	batch kvevents.Batch
}

func recvBatches(t *testing.T, sub zmq4.Socket, n int) []recvBatch {
	t.Helper()
	var out []recvBatch
	var dec kvevents.Decoder
	for len(out) < n {
		type res struct {
			m   zmq4.Msg
			err error
		}
		ch := make(chan res, 1)
		go func() { m, err := sub.Recv(); ch <- res{m, err} }()
		var r res
		select {
		case r = <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out after %d batches", len(out))
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		_, seq, payload, err := kvevents.ParseMessage(r.m.Frames)
		if err != nil {
			t.Fatal(err)
		}
		var b kvevents.Batch
		if err := dec.Decode(payload, &b); err != nil {
			t.Fatalf("decode seq %d: %v", seq, err)
		}
		b.Events = append([]kvevents.Event(nil), b.Events...)
		for i := range b.Events {
			b.Events[i].BlockHashes = append([]uint64(nil), b.Events[i].BlockHashes...)
		}
		out = append(out, recvBatch{seq, append([]byte(nil), payload...), b})
	}
	return out
}

// TestEventStreamEndToEnd checks sequence numbers, one batch per step,
// BlockStored for prompt and decode-filled blocks, BlockRemoved on eviction,
// AllBlocksCleared on reset, and the replay ROUTER over a DEALER.
func TestEventStreamEndToEnd(t *testing.T) {
	e := startEngine(t, Config{NumGPUBlocks: 6}) // 5 usable blocks
	sub := subscribe(t, e)
	h, _ := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf("0")})

	// 40-token prompt, 10 generated tokens: KV for 49 tokens = 3 full blocks
	// (2 at prefill, the 3rd filled by decode).
	prompt := seqIDs(100, 40)
	c := decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 10}))
	if c.Usage.CompletionTokens != 10 {
		t.Fatal(c.Usage)
	}
	got := recvBatches(t, sub, 2)
	want := h.AppendHashes(nil, prompt, kvhash.Extra{})
	ev0 := got[0].batch.Events
	if got[0].seq != 0 || len(ev0) != 1 || ev0[0].Type != kvevents.BlockStored || ev0[0].HasParent ||
		len(ev0[0].BlockHashes) != 2 || ev0[0].BlockHashes[0] != want[0] || ev0[0].BlockHashes[1] != want[1] {
		t.Fatalf("first batch %+v", got[0])
	}
	ev1 := got[1].batch.Events
	if got[1].seq != 1 || len(ev1) != 1 || ev1[0].Type != kvevents.BlockStored || !ev1[0].HasParent ||
		ev1[0].ParentBlockHash != want[1] || len(ev1[0].BlockHashes) != 1 || len(ev1[0].TokenIDs) != 16 {
		t.Fatalf("decode-filled block batch %+v", got[1])
	}
	// The decode-filled block's hash chains over prompt tail + output.
	var full []uint32
	full = append(full, prompt...)
	full = append(full, ev1[0].TokenIDs[8:]...)
	if w := h.AppendHashes(nil, full, kvhash.Extra{}); w[2] != ev1[0].BlockHashes[0] {
		t.Errorf("decode block hash %d, want %d", ev1[0].BlockHashes[0], w[2])
	}
	if got[0].batch.DataParallelRank != 0 || !got[0].batch.HasRank {
		t.Errorf("rank %+v", got[0].batch)
	}

	// A different 48-token prompt needs 4 blocks (3 at prefill, 1 when
	// decode computes token 49). Free: one never-used block, then the first
	// request's blocks in reverse (partial block, block 2, block 1, block 0).
	// Admission evicts block 2 (its own step, published at once), the
	// prefill announces its 3 blocks, the decode step evicts block 1.
	decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"prompt": seqIDs(9000, 48), "max_tokens": 2}))
	got = append(got, recvBatches(t, sub, 3)...)
	kinds := func(b recvBatch) (removed []uint64, stored int) {
		for _, ev := range b.batch.Events {
			switch ev.Type {
			case kvevents.BlockRemoved:
				removed = append(removed, ev.BlockHashes...)
			case kvevents.BlockStored:
				stored += len(ev.BlockHashes)
			}
		}
		return removed, stored
	}
	third := h.AppendHashes(nil, full, kvhash.Extra{})[2]
	wantSteps := []struct {
		removed []uint64
		stored  int
	}{{[]uint64{third}, 0}, {nil, 3}, {[]uint64{want[1]}, 0}}
	for i, w := range wantSteps {
		b := got[2+i]
		rm, st := kinds(b)
		if b.seq != uint64(2+i) || len(rm) != len(w.removed) || (len(rm) == 1 && rm[0] != w.removed[0]) || st != w.stored {
			t.Errorf("batch %d: seq %d removed %v stored %d, want %v %d", 2+i, b.seq, rm, st, w.removed, w.stored)
		}
	}

	if r := post(t, e.URL()+"/reset_prefix_cache", map[string]any{}); r.status != 200 {
		t.Fatalf("reset %d %s", r.status, r.body)
	}
	got = append(got, recvBatches(t, sub, 1)...)
	if last := got[len(got)-1]; last.seq != 5 || len(last.batch.Events) != 1 || last.batch.Events[0].Type != kvevents.AllBlocksCleared {
		t.Errorf("reset batch %+v", last)
	}

	// Replay from seq 1 over a DEALER.
	dealer := zmq4.NewDealer(context.Background())
	defer dealer.Close()
	if err := dealer.Dial(e.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom(kvevents.ReplayRequest(1)...)); err != nil {
		t.Fatal(err)
	}
	var replayed []recvBatch
	for {
		m, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		seq, payload, end, err := kvevents.ParseReplayReply(m.Frames)
		if err != nil {
			t.Fatal(err)
		}
		if end {
			break
		}
		replayed = append(replayed, recvBatch{seq: seq, raw: payload})
	}
	if len(replayed) != 5 {
		t.Fatalf("replayed %d batches, want 5", len(replayed))
	}
	for i, r := range replayed {
		if r.seq != got[i+1].seq || string(r.raw) != string(got[i+1].raw) {
			t.Errorf("replay %d differs from the live batch", i)
		}
	}
}

func TestReplayBufferIsBounded(t *testing.T) {
	p := &publisher{ring: make([]bufferedBatch, 0, 3)}
	p.pub = zmq4.NewPub(context.Background())
	defer p.pub.Close()
	for i := range 5 {
		p.publish([]byte{byte(i)})
	}
	got := p.since(0)
	if len(got) != 3 || got[0].seq != 2 || got[2].seq != 4 {
		t.Errorf("ring %+v", got)
	}
	if got := p.since(4); len(got) != 1 || got[0].seq != 4 {
		t.Errorf("since(4) %+v", got)
	}
}

// TestReplayLayouts checks the exact frames the replay ROUTER sends in each
// --replay-layout, as a DEALER receives them.
func TestReplayLayouts(t *testing.T) {
	ff := string([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	seq1 := string([]byte{0, 0, 0, 0, 0, 0, 0, 1})
	cases := []struct {
		layout     string
		reply, end []string
	}{
		{"current", []string{"", "kv-events", seq1, "p1"}, []string{"", "", ff, ""}},
		{"legacy", []string{"", seq1, "p1"}, []string{"", ff, ""}},
	}
	for _, tc := range cases {
		t.Run(tc.layout, func(t *testing.T) {
			p, err := newPublisher(slog.New(slog.NewTextHandler(io.Discard, nil)), "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "kv-events", 8, tc.layout)
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			p.publish([]byte("p0"))
			p.publish([]byte("p1"))
			dealer := zmq4.NewDealer(context.Background())
			defer dealer.Close()
			if err := dealer.Dial("tcp://" + p.replayAddr.String()); err != nil {
				t.Fatal(err)
			}
			if err := dealer.SendMulti(zmq4.NewMsgFrom(kvevents.ReplayRequest(1)...)); err != nil {
				t.Fatal(err)
			}
			for _, want := range [][]string{tc.reply, tc.end} {
				m, err := dealer.Recv()
				if err != nil {
					t.Fatal(err)
				}
				got := make([]string, len(m.Frames))
				for i, f := range m.Frames {
					got[i] = string(f)
				}
				if !slices.Equal(got, want) {
					t.Errorf("frames %q, want %q", got, want)
				}
			}
		})
	}
	if _, err := newPublisher(slog.New(slog.NewTextHandler(io.Discard, nil)), "tcp://127.0.0.1:0", "none", "", 8, "v3"); err == nil {
		t.Error("unknown replay layout accepted")
	}
	if err := (Config{ReplayLayout: "v3"}).withDefaults().validate(); err == nil || !strings.Contains(err.Error(), "replay-layout") {
		t.Errorf("validate: %v, want a replay-layout error", err)
	}
}
