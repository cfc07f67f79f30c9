package ingest

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultReplayPortOffset is LLB_KV_REPLAY_PORT_OFFSET's default: the replay
// ROUTER listens on the PUB port + 1000 (5557 → 6557); rank r adds r to both.
const DefaultReplayPortOffset = 1000

// ReplayStats describe one replay exchange.
type ReplayStats struct {
	Batches     int    // replies received and handed to the callback
	First, Last uint64 // sequence numbers of the first and last reply (valid when Batches > 0)
	Ended       bool   // the end marker arrived
	Hashes      int    // block hashes the replayed batches stored (set by the subscriber)
}

// errReplayStop is returned by a replay callback to end the exchange early.
var errReplayStop = errors.New("replay stopped by the consumer")

// fetchReplay asks the ROUTER at endpoint for every buffered batch with
// sequence ≥ start and passes each to fn in order, until the end marker,
// maxBatches replies, an error, or ctx's deadline. A fresh DEALER is used per
// exchange, so replies of an abandoned exchange never leak into the next.
// A reply that does not parse ends the exchange (what was applied stays).
func fetchReplay(ctx context.Context, endpoint string, start uint64, maxBatches int, dialTimeout time.Duration,
	fn func(seq uint64, payload []byte) error) (ReplayStats, error) {
	var st ReplayStats
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewDealer(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(dialTimeout),
		zmq4.WithTimeout(dialTimeout), zmq4.WithLogger(discardLogger()))
	defer sock.Close()
	if err := dialBounded(ctx, sock, endpoint, 2*dialTimeout); err != nil {
		return st, fmt.Errorf("dial replay %s: %w", endpoint, err)
	}
	if err := sock.SendMulti(zmq4.NewMsgFrom(kvevents.ReplayRequest(start)...)); err != nil {
		return st, fmt.Errorf("send replay request to %s: %w", endpoint, err)
	}
	for st.Batches < maxBatches {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return st, fmt.Errorf("replay from %s: %w", endpoint, ctx.Err())
			}
			return st, fmt.Errorf("receive replay from %s: %w", endpoint, err)
		}
		seq, payload, end, err := kvevents.ParseReplayReply(msg.Frames)
		if err != nil {
			return st, fmt.Errorf("replay from %s: %w", endpoint, err)
		}
		if end {
			st.Ended = true
			return st, nil
		}
		if st.Batches == 0 {
			st.First = seq
		}
		st.Last = seq
		st.Batches++
		if err := fn(seq, payload); err != nil {
			if errors.Is(err, errReplayStop) {
				return st, nil
			}
			return st, err
		}
	}
	return st, nil
}
