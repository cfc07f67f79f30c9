package interop

import (
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/internal/testpy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
)

// replayCounter counts failed replay exchanges.
type replayCounter struct {
	ingest.NopObserver
	failed atomic.Int64
}

func (c *replayCounter) Replay(_ ingest.EndpointRef, _ int, _ ingest.ReplayPurpose, ok bool, _ int) {
	if !ok {
		c.failed.Add(1)
	}
}

func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func storedPayload(t *testing.T, hashes ...uint64) string {
	t.Helper()
	b := &kvevents.Batch{TS: 1, HasRank: true, Events: []kvevents.Event{{Type: kvevents.BlockStored, BlockHashes: hashes, BlockSize: 16, Medium: "GPU"}}}
	p, err := kvevents.AppendEncode(nil, b, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(p)
}

// TestLibzmqReplayLayouts runs bootstrap and gap repair against a libzmq
// ROUTER answering in vLLM's current layout (topic frame in every reply) and
// in the legacy one. The topic is non-empty, so an empty topic frame cannot
// pass for the delimiter. Before ParseReplayReply took the current layout,
// every current reply failed with "replay reply has 4 frames" and neither
// bootstrap nor repair delivered anything.
func TestLibzmqReplayLayouts(t *testing.T) {
	testpy.Require(t, "zmq", "msgpack")
	for _, layout := range []string{"current", "legacy"} {
		t.Run(layout, func(t *testing.T) {
			ip := testnet.Host(t)
			const offset = ingest.DefaultReplayPortOffset
			port := testnet.PortPair(t, ip, offset)
			py := startPython(t, "tcp://"+net.JoinHostPort(ip, strconv.Itoa(port)),
				"tcp://"+net.JoinHostPort(ip, strconv.Itoa(port+offset)), layout, "kv-events")
			var want []uint64
			// Batches 0-2 predate the subscriber: only the bootstrap replay has them.
			for seq := range 3 {
				h := uint64(1000 + seq)
				py.send(map[string]any{"op": "buf", "seq": seq, "payload_hex": storedPayload(t, h)})
				want = append(want, h)
			}
			ix, err := inventory.New(inventory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rec := &replayCounter{}
			mgr := ingest.NewManager(ingest.Options{
				ReplayPortOffset: offset,
				DialRetry:        50 * time.Millisecond,
				RebuildDelay:     20 * time.Millisecond,
				Logger:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
				Observer:         rec,
			})
			t.Cleanup(mgr.Close)
			if err := mgr.Reconcile([]ingest.Target{{Service: 1, EPIdx: 0, IP: ip, Port: port, Ranks: 1, Inventory: ix}}); err != nil {
				t.Fatal(err)
			}
			waitInventory := func(step string, want []uint64) {
				t.Helper()
				want = slices.Sorted(slices.Values(want))
				deadline := time.Now().Add(15 * time.Second)
				for !slices.Equal(ix.Snapshot(0), want) {
					if time.Now().After(deadline) {
						t.Fatalf("%s: inventory %v, want %v", step, ix.Snapshot(0), want)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			waitInventory("bootstrap", want)
			// Batch 3 is missed live (buffered only), batch 4 arrives: the gap
			// is repaired from the replay socket. The subscription may take a
			// moment, so live batches repeat until one lands.
			py.send(map[string]any{"op": "buf", "seq": 3, "payload_hex": storedPayload(t, 2003)})
			want = append(want, 2003, 2004)
			for seq := 4; seq < 50; seq++ {
				py.send(map[string]any{"op": "pub", "seq": seq, "payload_hex": storedPayload(t, 2004), "topic": "kv-events"})
				if waitUntil(time.Second, func() bool { return slices.Contains(ix.Snapshot(0), 2004) }) {
					break
				}
			}
			waitInventory("gap repair", want)
			if rec.failed.Load() != 0 {
				t.Errorf("%d replay exchanges failed", rec.failed.Load())
			}
		})
	}
}
