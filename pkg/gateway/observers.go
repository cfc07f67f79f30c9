package gateway

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// proxyObserver feeds one rule's proxy measurements to pkg/metrics.
type proxyObserver struct {
	m       *metrics.Metrics
	service int
	pd      bool
}

func (o *proxyObserver) ConnectFailed(_ string, ep int) {
	o.m.ConnectFailure(o.service, ep)
	if o.pd {
		o.m.PDInc(o.m.PDConnectFailover, o.service)
	}
}

// BackendConn implements fullproxy.PoolObserver.
func (o *proxyObserver) BackendConn(_ string, _ int, result string) {
	o.m.BackendConn(o.service, result)
}

func (o *proxyObserver) TTFB(_ string, _ int, d time.Duration) { o.m.ObserveTTFB(o.service, d) }

func (o *proxyObserver) Inflight(_ string, ep, n int) { o.m.SetInflight(o.service, ep, n) }

func (o *proxyObserver) Done(r *fullproxy.Record) {
	ep := -1
	if r.Routed {
		ep = r.Decision.Endpoint
	}
	outcome := r.OutcomeLabel()
	if r.Outcome == fullproxy.OutcomeOK {
		outcome = statusClass(r.Status)
	}
	if ep >= 0 {
		o.m.ObserveRequest(o.service, ep, outcome, r.Duration)
		if r.Outcome == fullproxy.OutcomeBackendBroken {
			o.m.BrokenResponse(o.service, ep)
		}
	}
	if r.Decision.Model != "" {
		o.m.ObserveAIRequest(r.Decision.Model, "", r.Status, r.Duration)
	}
}

func statusClass(status int) string {
	switch {
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	case status >= 200:
		return "2xx"
	}
	return "other"
}

// selectorObserver feeds the selector's non-decision counters.
type selectorObserver struct{ m *metrics.Metrics }

func (o selectorObserver) ZeroHitWatchdog(id uint32) { o.m.ZeroHitWatchdogInc(int(id)) }
func (o selectorObserver) SessionHit(id uint32)      { o.m.Tier1Hit(int(id), "session") }
func (o selectorObserver) TrieHit(id uint32)         { o.m.Tier1Hit(int(id), "trie") }
func (o selectorObserver) Sessions(id uint32, n int) {
	o.m.PDSessionsActive.WithLabelValues(strconv.Itoa(int(id))).Set(float64(n))
}

// subscriberObserver feeds the KV-event subscribers' metrics, and tells
// model discovery of each rebuilt subscription (reconnects; nil: nobody).
type subscriberObserver struct {
	m          *metrics.Metrics
	reconnects chan<- reconnect
}

func (o subscriberObserver) EndpointInfo(ep ingest.EndpointRef) {
	o.m.SetEPInfo(int(ep.Service), ep.EPIdx, ep.IP, ep.IP)
}
func (o subscriberObserver) EndpointGone(ep ingest.EndpointRef) {
	o.m.DeleteEndpoint(int(ep.Service), ep.EPIdx)
}
func (o subscriberObserver) Connected(ep ingest.EndpointRef, up bool) {
	o.m.SetSubscriberConnected(int(ep.Service), ep.EPIdx, up)
}
func (o subscriberObserver) RankConnected(ep ingest.EndpointRef, rank int, up bool) {
	o.m.SetRankConnected(int(ep.Service), ep.EPIdx, rank, up)
}
func (o subscriberObserver) Reconnected(ep ingest.EndpointRef) {
	o.m.SubscriberReconnect(int(ep.Service), ep.EPIdx)
	select {
	case o.reconnects <- reconnect{service: int(ep.Service), ep: ep.EPIdx}:
	default: // full (or nil): the next probe-up or interval re-reads it
	}
}
func (o subscriberObserver) RecvError(ep ingest.EndpointRef) {
	o.m.SubscriberRecvError(int(ep.Service), ep.EPIdx)
}
func (o subscriberObserver) Blocks(ep ingest.EndpointRef, blocks int) {
	o.m.SetKVBlocks(int(ep.Service), ep.EPIdx, blocks)
}
func (o subscriberObserver) OtherMediaBlocks(ep ingest.EndpointRef, blocks int) {
	o.m.SetKVBlocksOtherMedium(int(ep.Service), ep.EPIdx, blocks)
}
func (o subscriberObserver) CapEvicted(ep ingest.EndpointRef, n int) {
	o.m.InvCapEvicted(int(ep.Service), ep.EPIdx, n)
}
func (o subscriberObserver) Sequence(ep ingest.EndpointRef, _ int, c ingest.SeqCase, missing uint64) {
	o.m.SeqMissingAdd(int(ep.Service), ep.EPIdx, missing) // only gaps skip numbers
	switch kind := c.String(); kind {
	case "small_gap":
		o.m.SubscriberGap(int(ep.Service), ep.EPIdx, "small")
	case "large_gap":
		o.m.SubscriberGap(int(ep.Service), ep.EPIdx, "large")
	case "restart":
		o.m.SubscriberGap(int(ep.Service), ep.EPIdx, "restart")
	}
}
func (o subscriberObserver) Cleared(ep ingest.EndpointRef, _ int, r ingest.ClearReason) {
	o.m.SubscriberClear(int(ep.Service), ep.EPIdx, r.String())
}
func (o subscriberObserver) Replay(ep ingest.EndpointRef, _ int, _ ingest.ReplayPurpose, ok bool, batches int) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	o.m.SubscriberReplay(int(ep.Service), ep.EPIdx, outcome)
	if batches > 0 {
		o.m.SubscriberBatches(int(ep.Service), ep.EPIdx, 0, batches)
	}
}

// Applied counts live batches (ingest.BatchObserver).
func (o subscriberObserver) Applied(ep ingest.EndpointRef, _ int, batches, stored, removed int) {
	o.m.SubscriberBatches(int(ep.Service), ep.EPIdx, batches, 0)
	o.m.SubscriberHashes(int(ep.Service), ep.EPIdx, stored, removed)
}

func (o subscriberObserver) DecodeError(ep ingest.EndpointRef, _ int) {
	o.m.SubscriberRecvError(int(ep.Service), ep.EPIdx)
	o.m.DecodeError(int(ep.Service), ep.EPIdx)
}

// parityObserver feeds the live parity self-check's metrics.
type parityObserver struct{ m *metrics.Metrics }

func (o parityObserver) ParityChecked(ep ingest.EndpointRef) {
	o.m.ParityCheckedInc(int(ep.Service), ep.EPIdx)
}
func (o parityObserver) ParityUnchecked(ep ingest.EndpointRef, cause string) {
	o.m.ParityUncheckedInc(int(ep.Service), ep.EPIdx, cause)
}
func (o parityObserver) ParityMismatch(ep ingest.EndpointRef, reason string) {
	o.m.ParityMismatchInc(int(ep.Service), ep.EPIdx, reason)
}
func (o parityObserver) ParityState(ep ingest.EndpointRef, state int) {
	o.m.SetParityState(int(ep.Service), ep.EPIdx, state)
}

// poolObserver logs tokenizer loads (there is no tokenizer metric yet).
type poolObserver struct{ log *slog.Logger }

func (o poolObserver) TokenizerLoaded(model string, reload bool, d time.Duration) {
	o.log.Info("tokenizer loaded", "model", model, "reload", reload, "took", d)
}
func (o poolObserver) TokenizerLoadFailed(model string, err error) {
	o.log.Warn("tokenizer load failed; requests for this model take the fallback (reason tokenize)", "model", model, "reason", tokenizer.ErrorReason(err), "err", err)
}

// healthObserver feeds pkg/health's counters to pkg/metrics.
type healthObserver struct{ m *metrics.Metrics }

func (o healthObserver) BreakerFlip(id uint32, ep int, to health.BreakerState) {
	o.m.SetCircuitBreaker(int(id), ep, int(to), true)
}
func (o healthObserver) ProbeTransition(id uint32, ep int, up bool) {
	o.m.SetProbe(int(id), ep, up, true)
}
func (o healthObserver) AdmissionShed(id uint32)        { o.m.PDInc(o.m.PDAdmissionShed, int(id)) }
func (o healthObserver) AdmissionQueued(id uint32)      { o.m.PDInc(o.m.PDAdmissionQueued, int(id)) }
func (o healthObserver) AdmissionParkTimeout(id uint32) { o.m.PDInc(o.m.PDParkTimeouts, int(id)) }
func (o healthObserver) ScrapeFailed(uint32, int)       {}
func (o healthObserver) EngineFigures(id uint32, ep int, gpuBlocks, waiting int64) {
	o.m.SetEngineFigures(int(id), ep, gpuBlocks, waiting)
}
