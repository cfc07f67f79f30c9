package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents/trtllm"
)

// TensorRT-LLM publishes no ZeroMQ stream: trtllm-serve answers
// POST /kv_cache_events with the events since the previous call (a
// destructive drain, so one consumer only). The drain poller below is that
// engine's ingest adapter (docs/engines.md, "TensorRT-LLM events";
// docs/ingest.md, "TensorRT-LLM drain").

const (
	// DefaultTRTLLMPollMin and DefaultTRTLLMPollMax are the reference's
	// LOXILB_KV_TRTLLM_POLL_MIN_MS / _MAX_MS defaults.
	DefaultTRTLLMPollMin = 5 * time.Millisecond
	DefaultTRTLLMPollMax = 20 * time.Millisecond
	// trtllmDrainPath is trtllm-serve's drain.
	trtllmDrainPath = "/kv_cache_events"
	// trtllmSecondary is the inventory medium of TensorRT-LLM's secondary
	// (host) cache level; only level 0, the GPU pool, scores.
	trtllmSecondary = "CPU"
	// gapWarnEvery rate-limits the lost-events warning per endpoint.
	gapWarnEvery = time.Minute
)

// drainPoller follows one TensorRT-LLM endpoint.
type drainPoller struct {
	ep     *endpointSub
	url    string
	client *http.Client
	opts   Options
	log    *slog.Logger
	ingest Ingester
	// last is the last event_id applied per attention-DP rank: each rank's
	// KV cache manager numbers its own events from 0.
	last       map[int]int64
	lastWarned time.Time
	// lastAll is the last event_id applied on any rank. Whether ranks
	// number their events apart or share one sequence, an id that follows
	// either is not a gap.
	lastAll  int64
	knownAll bool
	// refused is the engine's kv_cache_hash_algo when kvgate does not
	// compute it: the drain is still taken (one consumer), nothing stored.
	refused string
}

// trtllmServerInfo is what kvgate reads of trtllm-serve's GET /server_info.
type trtllmServerInfo struct {
	TokensPerBlock int    `json:"tokens_per_block"`
	HashAlgo       string `json:"kv_cache_hash_algo"`
}

// readServerInfo checks the engine's block size and block-key algorithm
// once the endpoint answers. Older builds lack /server_info or the fields;
// the drained blocks' sizes then tell the block size.
func (p *drainPoller) readServerInfo(ctx context.Context) {
	url := strings.TrimSuffix(p.url, trtllmDrainPath) + "/server_info"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	p.ep.target.authorize(req)
	resp, err := p.client.Do(req)
	if err != nil {
		p.log.Debug("kv drain: /server_info unreadable", "err", err)
		return
	}
	defer resp.Body.Close()
	var info trtllmServerInfo
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info) != nil {
		p.log.Debug("kv drain: no usable /server_info", "status", resp.StatusCode)
		return
	}
	g := p.ingest.Granularity
	if info.TokensPerBlock > 0 && g != nil {
		var res IngestResult
		if p.ingest.blockSizeBad(info.TokensPerBlock, &res) {
			p.log.Warn("kv drain: the engine's tokens_per_block is not kvBlockSize; its blocks can never match a request (requests skip the KV tier with reason hashes, kvgate_kv_skip_total{cause=\"block_size\"})",
				"tokens_per_block", info.TokensPerBlock, "kvBlockSize", g.HashBlockSize())
		}
	}
	switch info.HashAlgo {
	case "", "v1_block_key", "auto":
		// auto resolves to the v1 block key on the KV cache manager kvgate
		// follows (docs/engines.md).
		p.refused = ""
	default:
		if p.refused == "" {
			p.log.Error("kv drain: the engine's kv_cache_hash_algo is not v1_block_key; kvgate does not compute it, so this endpoint is not scored (requests skip with reason hashes, kvgate_kv_skip_total{cause=\"hash_algo\"})",
				"kv_cache_hash_algo", info.HashAlgo)
		}
		p.refused = info.HashAlgo
		p.clearAll(ClearUnverified)
	}
	if g != nil {
		g.refuseAlgo(p.ingest.EPIdx, p.refused)
	}
}

func newDrainPoller(e *endpointSub, t Target, opts Options) *drainPoller {
	ec := t.httpClient()
	url := ec.URL(t.IP, t.Port, trtllmDrainPath)
	return &drainPoller{
		ep:     e,
		url:    url,
		client: ec.HTTP(opts.DrainTimeout),
		opts:   opts,
		log:    opts.Logger.With("service", t.Service, "ep_idx", t.EPIdx, "drain", url),
		ingest: Ingester{Inventory: t.Inventory, EPIdx: t.EPIdx, Engine: EngineTRTLLM, Granularity: t.Granularity},
		last:   map[int]int64{},
	}
}

// run polls until ctx ends: again after PollMin while drains return
// events, backing off (doubling) to PollMax while they are empty, and from
// RebuildDelay to RebuildMaxDelay while the endpoint cannot be reached.
func (p *drainPoller) run(ctx context.Context) {
	interval := p.opts.PollMin
	failDelay := p.opts.RebuildDelay
	up, failLogged := false, false
	setUp := func(v bool) {
		if v != up {
			up = v
			p.ep.drainUp.Store(v)
			p.ep.obs.RankConnected(p.ep.ref, 0, v)
			p.ep.obs.Connected(p.ep.ref, v)
		}
	}
	defer setUp(false)
	for ctx.Err() == nil {
		n, err := p.poll(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if up || !failLogged {
				p.log.Warn("kv drain: poll failed; retrying", "err", err, "after", failDelay)
				failLogged = true
			}
			if up {
				p.ep.obs.RecvError(p.ep.ref)
			}
			setUp(false)
			if !sleepCtx(ctx, failDelay) {
				return
			}
			failDelay = min(2*failDelay, p.opts.RebuildMaxDelay)
			continue
		}
		if !up {
			p.log.Info("kv drain: polling")
			p.readServerInfo(ctx)
		}
		setUp(true)
		failDelay, failLogged = p.opts.RebuildDelay, false
		if n > 0 {
			interval = p.opts.PollMin
		} else {
			interval = min(2*interval, p.opts.PollMax)
		}
		if !sleepCtx(ctx, interval) {
			return
		}
	}
}

// poll drains once and applies what came back; n is the number of events.
func (p *drainPoller) poll(ctx context.Context) (n int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, http.NoBody)
	if err != nil {
		return 0, fmt.Errorf("drain request: %w", err)
	}
	p.ep.target.authorize(req)
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("drain: %w", engineclient.Explain(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(p.opts.MaxDrainBytes)+1))
	if err != nil {
		return 0, fmt.Errorf("drain: read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("drain: HTTP %d: %.200s", resp.StatusCode, bytes.TrimSpace(body))
	}
	if len(body) > p.opts.MaxDrainBytes {
		// The events are gone from the engine either way: what kvgate holds
		// for this endpoint is no longer exact.
		p.clearAll(ClearLargeGap)
		p.ep.obs.DecodeError(p.ep.ref, 0)
		return 1, fmt.Errorf("drain: body exceeds %d bytes (LLB_KV_MAX_FRAME_BYTES); inventory cleared", p.opts.MaxDrainBytes)
	}
	evs, err := trtllm.Decode(body)
	if err != nil {
		p.clearAll(ClearLargeGap)
		p.ep.obs.DecodeError(p.ep.ref, 0)
		p.log.Warn("kv drain: body not applied; inventory cleared (the drained events are lost)", "err", err)
		return 1, nil
	}
	p.apply(evs)
	return len(evs), nil
}

// apply folds one drain into the inventory in event_id order (ties keep
// the drain's order). A gap in a rank's ids means events were lost (another consumer
// drained them, or the engine's event buffer overflowed): that rank is
// cleared, as the sequence window clears a vLLM rank it cannot repair. A
// created event is a (re)started KV cache manager: its rank starts empty.
func (p *drainPoller) apply(evs []trtllm.Event) {
	slices.SortStableFunc(evs, func(a, b trtllm.Event) int {
		switch {
		case a.EventID < b.EventID:
			return -1
		case a.EventID > b.EventID:
			return 1
		}
		return 0
	})
	for i := range evs {
		e := &evs[i]
		rank := e.Rank()
		if rank >= inventory.MaxRanks {
			p.ep.obs.DecodeError(p.ep.ref, 0)
			continue
		}
		last, known := p.last[rank]
		switch {
		case e.Data.Type == trtllm.Created:
			if known {
				p.log.Info("kv drain: the engine's KV cache manager was (re)created; rank inventory cleared", "rank", rank, "event_id", e.EventID)
				p.clear(rank, ClearRestart)
			}
		case known && e.EventID == last:
			continue // already applied
		case known && e.EventID < last:
			p.log.Warn("kv drain: event ids went back; the engine restarted, rank inventory cleared", "rank", rank, "last", last, "event_id", e.EventID)
			p.clear(rank, ClearRestart)
		case known && e.EventID > last+1 && !(p.knownAll && e.EventID == p.lastAll+1):
			p.warnLost(rank, last, e.EventID)
			p.clear(rank, ClearLargeGap)
		}
		p.last[rank] = e.EventID
		p.lastAll, p.knownAll = e.EventID, true
		if p.refused != "" {
			continue // not our hashes: nothing to store
		}
		res, err := p.ingest.applyTRTLLM(e)
		if err != nil {
			p.log.Warn("kv drain: event not applied", "event_id", e.EventID, "err", err)
		}
		if res.BadBlockSize {
			p.log.Warn("kv drain: the engine's tokens_per_block is not kvBlockSize; its blocks can never match a request and are not stored (requests skip the KV tier with reason hashes, kvgate_kv_skip_total{cause=\"block_size\"})",
				"tokens_per_block", res.BlockSize, "kvBlockSize", p.ingest.Granularity.HashBlockSize())
		}
	}
	reportBlocks(p.ep.obs, p.ep.ref, p.ingest.Inventory, p.ingest.EPIdx)
}

func (p *drainPoller) warnLost(rank int, last, got int64) {
	if now := time.Now(); now.Sub(p.lastWarned) >= gapWarnEvery {
		p.lastWarned = now
		p.log.Warn("kv drain: event ids jumped, events were lost; rank inventory cleared. POST /kv_cache_events is a destructive drain: if another consumer (a second gateway replica, a script) drains this endpoint, stop it; otherwise raise the engine's event_buffer_max_size",
			"rank", rank, "last_event_id", last, "event_id", got, "lost", got-last-1)
	}
}

func (p *drainPoller) clear(rank int, reason ClearReason) {
	if err := p.ingest.Inventory.ClearRank(p.ingest.EPIdx, rank); err != nil {
		p.log.Warn("kv drain: clear failed", "rank", rank, "err", err)
	}
	p.ep.obs.Cleared(p.ep.ref, rank, reason)
}

func (p *drainPoller) clearAll(reason ClearReason) {
	if err := p.ingest.Inventory.ClearEndpoint(p.ingest.EPIdx); err != nil {
		p.log.Warn("kv drain: clear failed", "err", err)
	}
	p.ep.obs.Cleared(p.ep.ref, 0, reason)
	clear(p.last)
	p.knownAll = false
	reportBlocks(p.ep.obs, p.ep.ref, p.ingest.Inventory, p.ingest.EPIdx)
}

// applyTRTLLM applies one drained event on its attention-DP rank.
func (in *Ingester) applyTRTLLM(e *trtllm.Event) (IngestResult, error) {
	var res IngestResult
	rank := e.Rank()
	d := &e.Data
	var err error
	switch d.Type {
	case trtllm.Created:
		err = in.Inventory.ClearRank(in.EPIdx, rank)
		res.Cleared = true
	case trtllm.Stored:
		err = in.storeTRTLLM(rank, d.Blocks, &res)
	case trtllm.Removed:
		if err = in.Inventory.Remove(in.EPIdx, rank, inventory.MediumGPU, d.BlockHashes); err == nil {
			err = in.Inventory.Remove(in.EPIdx, rank, trtllmSecondary, d.BlockHashes)
		}
		res.Removed += len(d.BlockHashes)
	case trtllm.Updated:
		if c := d.CacheLevel; c != nil && c.New != c.Old {
			from, to := inventory.MediumGPU, trtllmSecondary
			if c.New == 0 {
				from, to = to, from
			}
			hs := []uint64{d.BlockHash}
			if err = in.Inventory.Remove(in.EPIdx, rank, from, hs); err == nil {
				err = in.Inventory.Add(in.EPIdx, rank, to, hs)
			}
		}
	}
	if err != nil {
		return res, fmt.Errorf("apply trtllm %s: %w", d.Type, err)
	}
	return res, nil
}

// storeTRTLLM adds a stored event's blocks. Only full blocks of kvBlockSize
// tokens can match a request; the engine also publishes its trailing
// partial block, which is not kept. Blocks of cache level 0 are GPU blocks
// and score; the secondary level is kept apart.
func (in *Ingester) storeTRTLLM(rank int, blocks []trtllm.Block, res *IngestResult) error {
	want := 0
	if in.Granularity != nil {
		want = in.Granularity.HashBlockSize()
	}
	var gpu, secondary []uint64
	for j := range blocks {
		b := &blocks[j]
		if n := len(b.Tokens); want > 0 && n != want {
			// A block larger than kvBlockSize, or a short one that is not
			// the last, shows the engine's tokens_per_block differs.
			if (n > want || j < len(blocks)-1) && in.blockSizeBad(n, res) {
				res.Unmatchable++
			}
			continue
		}
		if want > 0 && in.blockSizeBad(want, res) {
			res.Unmatchable++
			continue
		}
		if b.CacheLevel == 0 {
			gpu = append(gpu, b.BlockHash)
		} else {
			secondary = append(secondary, b.BlockHash)
		}
	}
	if err := in.Inventory.Add(in.EPIdx, rank, inventory.MediumGPU, gpu); err != nil {
		return err
	}
	if err := in.Inventory.Add(in.EPIdx, rank, trtllmSecondary, secondary); err != nil {
		return err
	}
	res.Stored += len(gpu) + len(secondary)
	return nil
}
