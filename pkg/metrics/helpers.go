package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// partialDeleter is every *Vec: series can be deleted by a subset of labels.
type partialDeleter interface {
	DeletePartialMatch(prometheus.Labels) int
}

// scoped lists the vectors by the labels that scope them, for teardown.
type scoped struct {
	byService    []partialDeleter // carry "service"
	byEPIdx      []partialDeleter // carry "service" and "ep_idx"
	bySubscriber []partialDeleter // carry "service" and "ep" (the subscriber's ep holds the ep_idx)
}

func (m *Metrics) scopes() *scoped {
	m.scopeOnce.Do(func() {
		s := &scoped{}
		svcIdx := []partialDeleter{m.Tier15Hits, m.Tier15Spills, m.Tier15ColdSeeds, m.KVBlocks, m.KVBlocksOtherMedium,
			m.EPInfo, m.Requests, m.RequestDuration, m.Inflight, m.ConnectFailures, m.PDCBFlips, m.CBState,
			m.ProbeUp, m.ProbeTransitions, m.AdminDown, m.EngineQueued, m.EngineCapacity,
			m.ParityChecked, m.ParityUnchecked, m.ParityMismatch, m.ParityState}
		svcEP := []partialDeleter{m.SubscriberConnected, m.SubscriberReconnects, m.SubscriberRecvErrors, m.InvCapEvictions,
			m.RankConnected, m.SubscriberGaps, m.SubscriberClears, m.SubscriberReplays, m.ReplayedBatches, m.EventBatches,
			m.EventHashes, m.SeqMissing, m.DecodeErrors}
		svcOnly := []partialDeleter{m.Tier15MissReason, m.Tier15Fallthrough, m.Tier1SessionHits, m.Tier1TrieHits,
			m.TTFB, m.DecisionStage, m.DecisionTier, m.SelectFailures, m.PDSessionsActive, m.PDTrieNodes,
			m.PDFallbackToNormal, m.PDAdmissionShed, m.PDAdmissionQueued, m.PDParkTimeouts, m.PDPrefillEPDied,
			m.PDDecodeEPDied, m.PDDecodeZeroByte, m.PDConnectFailover, m.PDTimeouts, m.PDRetries, m.PDLegDuration, m.KVSkips,
			m.RuleDatapath, m.TLSHandshakeErrors, m.TLSCertReloads, m.BackendConns}
		s.byEPIdx = svcIdx
		s.bySubscriber = svcEP
		s.byService = append(append(append([]partialDeleter{}, svcIdx...), svcEP...), svcOnly...)
		m.scope = s
	})
	return m.scope
}

// InitRule pre-creates a rule's series at 0: the nine miss reasons, the
// fallthrough counter and the tier-1 hit counters, so that rate() and the
// go/no-go assertions of docs/deploy.md work before the first request. Calling it again for
// the same rule is harmless.
func (m *Metrics) InitRule(service int) {
	s := itoa(service)
	for _, r := range MissReasons {
		m.Tier15MissReason.WithLabelValues(s, r)
	}
	m.Tier15Fallthrough.WithLabelValues(s)
	m.Tier1SessionHits.WithLabelValues(s)
	m.Tier1TrieHits.WithLabelValues(s)
	m.ZeroHitWatchdog.WithLabelValues(s)
	m.rulesMu.Lock()
	m.ruleIDs[service] = true
	m.Rules.Set(float64(len(m.ruleIDs)))
	m.rulesMu.Unlock()
}

// DeleteRule removes every series of the rule (on rule delete), so a later
// rule that reuses the service id starts clean.
func (m *Metrics) DeleteRule(service int) {
	l := prometheus.Labels{"service": itoa(service)}
	for _, v := range m.scopes().byService {
		v.DeletePartialMatch(l)
	}
	m.ZeroHitWatchdog.DeletePartialMatch(prometheus.Labels{"service_id": itoa(service)})
	m.rulesMu.Lock()
	delete(m.ruleIDs, service)
	m.Rules.Set(float64(len(m.ruleIDs)))
	m.rulesMu.Unlock()
}

// DeleteEndpoint removes every series of one endpoint of a rule (when the
// endpoint leaves the rule). Its ep_idx is not reused while the rule lives.
func (m *Metrics) DeleteEndpoint(service, epIdx int) {
	s, e := itoa(service), itoa(epIdx)
	for _, v := range m.scopes().byEPIdx {
		v.DeletePartialMatch(prometheus.Labels{"service": s, "ep_idx": e})
	}
	for _, v := range m.scopes().bySubscriber {
		v.DeletePartialMatch(prometheus.Labels{"service": s, "ep": e})
	}
}

// KV tier.

// Tier15Hit counts a request that Tier 1.5 actually routed to epIdx.
func (m *Metrics) Tier15Hit(service, epIdx int) {
	m.Tier15Hits.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// Tier15Miss counts one guard miss; reason is one of MissReasons.
func (m *Metrics) Tier15Miss(service int, reason string) {
	m.Tier15MissReason.WithLabelValues(itoa(service), reason).Inc()
}

// Tier15FallthroughInc counts a request that left the KV tier for the fallback.
func (m *Metrics) Tier15FallthroughInc(service int) {
	m.Tier15Fallthrough.WithLabelValues(itoa(service)).Inc()
}

// Tier15Spill counts a decision moved by the load blend to epIdx.
func (m *Metrics) Tier15Spill(service, epIdx int) {
	m.Tier15Spills.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// Tier15ColdSeed counts a hit redirected to the cold endpoint epIdx.
func (m *Metrics) Tier15ColdSeed(service, epIdx int) {
	m.Tier15ColdSeeds.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// ZeroHitWatchdogInc counts a lookup past the zero-hit threshold.
func (m *Metrics) ZeroHitWatchdogInc(service int) {
	m.ZeroHitWatchdog.WithLabelValues(itoa(service)).Inc()
}

// Tier1Hit counts a Tier-1 decision; kind is "session" or "trie".
func (m *Metrics) Tier1Hit(service int, kind string) {
	if kind == "trie" {
		m.Tier1TrieHits.WithLabelValues(itoa(service)).Inc()
		return
	}
	m.Tier1SessionHits.WithLabelValues(itoa(service)).Inc()
}

// Inventory and subscribers.

// SetKVBlocks sets the endpoint's GPU inventory size.
func (m *Metrics) SetKVBlocks(service, epIdx, blocks int) {
	m.KVBlocks.WithLabelValues(itoa(service), itoa(epIdx)).Set(float64(blocks))
}

// SetKVBlocksOtherMedium sets the endpoint's non-GPU block count.
func (m *Metrics) SetKVBlocksOtherMedium(service, epIdx, blocks int) {
	m.KVBlocksOtherMedium.WithLabelValues(itoa(service), itoa(epIdx)).Set(float64(blocks))
}

// SetEPInfo publishes the join series: ep is the endpoint IP (as the
// reference), addr its ip:port key.
func (m *Metrics) SetEPInfo(service, epIdx int, ip, addr string) {
	m.EPInfo.WithLabelValues(itoa(service), itoa(epIdx), ip, addr).Set(1)
}

// SetSubscriberConnected sets loxilb_kv_subscriber_connected (all ranks up).
func (m *Metrics) SetSubscriberConnected(service, epIdx int, up bool) {
	m.SubscriberConnected.WithLabelValues(itoa(service), itoa(epIdx)).Set(b2f(up))
}

// SetRankConnected sets the per-rank connected gauge.
func (m *Metrics) SetRankConnected(service, epIdx, rank int, up bool) {
	m.RankConnected.WithLabelValues(itoa(service), itoa(epIdx), itoa(rank)).Set(b2f(up))
}

// SubscriberReconnect counts a successful socket rebuild.
func (m *Metrics) SubscriberReconnect(service, epIdx int) {
	m.SubscriberReconnects.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// SubscriberRecvError counts a receive error.
func (m *Metrics) SubscriberRecvError(service, epIdx int) {
	m.SubscriberRecvErrors.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// InvCapEvicted adds blocks evicted by the per-endpoint cap.
func (m *Metrics) InvCapEvicted(service, epIdx, blocks int) {
	m.InvCapEvictions.WithLabelValues(itoa(service), itoa(epIdx)).Add(float64(blocks))
}

// SubscriberGap counts a sequence gap; kind is small, large or restart.
func (m *Metrics) SubscriberGap(service, epIdx int, kind string) {
	m.SubscriberGaps.WithLabelValues(itoa(service), itoa(epIdx), kind).Inc()
}

// SeqMissingAdd adds the sequence numbers one gap of the KV-event stream skipped.
func (m *Metrics) SeqMissingAdd(service, epIdx int, missing uint64) {
	if missing > 0 {
		m.SeqMissing.WithLabelValues(itoa(service), itoa(epIdx)).Add(float64(missing))
	}
}

// DecodeError counts a KV-event frame that did not decode.
func (m *Metrics) DecodeError(service, epIdx int) {
	m.DecodeErrors.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// SubscriberClear counts a rank inventory clear; reason is large_gap,
// restart or unverified.
func (m *Metrics) SubscriberClear(service, epIdx int, reason string) {
	m.SubscriberClears.WithLabelValues(itoa(service), itoa(epIdx), reason).Inc()
}

// KVSkip counts a request whose KV tier was skipped for a named cause:
// block_size (guard reason hashes), or a request-side bound (reason
// tokenize; docs/tokenizer.md, Bounds).
func (m *Metrics) KVSkip(service int, cause string) {
	m.KVSkips.WithLabelValues(itoa(service), cause).Inc()
}

// SubscriberReplay counts a replay request; outcome is ok or error.
func (m *Metrics) SubscriberReplay(service, epIdx int, outcome string) {
	m.SubscriberReplays.WithLabelValues(itoa(service), itoa(epIdx), outcome).Inc()
}

// SubscriberHashes counts the hashes of one live batch applied, so the
// ingest rate in hashes per second is a rate() away (docs/ingest.md).
func (m *Metrics) SubscriberHashes(service, epIdx int, stored, removed int) {
	if stored > 0 {
		m.EventHashes.WithLabelValues(itoa(service), itoa(epIdx), "stored").Add(float64(stored))
	}
	if removed > 0 {
		m.EventHashes.WithLabelValues(itoa(service), itoa(epIdx), "removed").Add(float64(removed))
	}
}

// SubscriberBatches counts applied batches, live and replayed.
func (m *Metrics) SubscriberBatches(service, epIdx int, live, replayed int) {
	if live > 0 {
		m.EventBatches.WithLabelValues(itoa(service), itoa(epIdx)).Add(float64(live))
	}
	if replayed > 0 {
		m.ReplayedBatches.WithLabelValues(itoa(service), itoa(epIdx)).Add(float64(replayed))
	}
}

// Proxy.

// ObserveTTFB records the backend's time to first response byte.
func (m *Metrics) ObserveTTFB(service int, d time.Duration) {
	m.TTFB.WithLabelValues(itoa(service)).Observe(d.Seconds())
}

// ObserveRequest counts a finished request and its duration. outcome is a
// short word chosen by the proxy (e.g. 2xx, 4xx, 5xx, backend_unreachable,
// client_gone, timeout).
func (m *Metrics) ObserveRequest(service, epIdx int, outcome string, d time.Duration) {
	s, e := itoa(service), itoa(epIdx)
	m.Requests.WithLabelValues(s, e, outcome).Inc()
	m.RequestDuration.WithLabelValues(s, e, outcome).Observe(d.Seconds())
}

// SetInflight publishes the endpoint's in-flight count.
func (m *Metrics) SetInflight(service, epIdx, n int) {
	m.Inflight.WithLabelValues(itoa(service), itoa(epIdx)).Set(float64(n))
}

// ConnectFailure counts a failed backend dial.
func (m *Metrics) ConnectFailure(service, epIdx int) {
	m.ConnectFailures.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// BrokenResponse counts a response the backend cut before its body's end.
func (m *Metrics) BrokenResponse(service, epIdx int) {
	m.BrokenResponses.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// ObserveStage records one decision stage's latency (DecisionStages).
func (m *Metrics) ObserveStage(service int, stage string, d time.Duration) {
	m.DecisionStage.WithLabelValues(itoa(service), stage).Observe(d.Seconds())
}

// Decision counts a routing decision by tier.
func (m *Metrics) Decision(service int, tier string) {
	m.DecisionTier.WithLabelValues(itoa(service), tier).Inc()
}

// ObserveAIRequest feeds the reference's AI-gateway request metrics.
func (m *Metrics) ObserveAIRequest(model, tenant string, status int, d time.Duration) {
	ml := m.ModelLabel(model)
	m.AIRequests.WithLabelValues(ml, tenant, itoa(status)).Inc()
	m.AIRequestSeconds.WithLabelValues(ml, tenant).Observe(d.Seconds())
}

// P/D and health.

// PDInc increments a per-rule P/D counter, one of the PD* vectors labelled by service alone.
func (m *Metrics) PDInc(v *prometheus.CounterVec, service int) {
	v.WithLabelValues(itoa(service)).Inc()
}

// PDTimeout counts a P/D timeout; kind is pd_prefill_timeout,
// pd_decode_timeout or pd_decode_stream_timeout.
func (m *Metrics) PDTimeout(service int, kind string) {
	m.PDTimeouts.WithLabelValues(itoa(service), kind).Inc()
}

// ObservePDLeg records a P/D leg's latency; leg is prefill or decode.
func (m *Metrics) ObservePDLeg(service int, leg, model string, d time.Duration) {
	m.PDLegDuration.WithLabelValues(itoa(service), leg).Observe(d.Seconds())
	if model == "" {
		return
	}
	if leg == "prefill" {
		m.AIPDPrefillSeconds.WithLabelValues(m.ModelLabel(model)).Observe(d.Seconds())
	} else {
		m.AIPDDecodeTTFT.WithLabelValues(m.ModelLabel(model)).Observe(d.Seconds())
	}
}

// AIPDRequest counts a P/D request by (phase, status).
func (m *Metrics) AIPDRequest(model, phase, status string) {
	m.AIPDRequests.WithLabelValues(m.ModelLabel(model), phase, status).Inc()
}

// SetCircuitBreaker publishes the breaker state (0 closed, 1 open, 2
// half-open); flipped counts a change.
func (m *Metrics) SetCircuitBreaker(service, epIdx, state int, flipped bool) {
	s, e := itoa(service), itoa(epIdx)
	m.CBState.WithLabelValues(s, e).Set(float64(state))
	if flipped {
		m.PDCBFlips.WithLabelValues(s, e).Inc()
	}
}

// SetEngineFigures publishes one engine scrape: kvgate_endpoint_capacity_blocks
// and kvgate_endpoint_engine_waiting. A negative value (the family was
// missing) drops the series, so a stale figure is not shown as current.
func (m *Metrics) SetEngineFigures(service, epIdx int, gpuBlocks, waiting int64) {
	s, e := itoa(service), itoa(epIdx)
	for _, f := range []struct {
		g *prometheus.GaugeVec
		v int64
	}{{m.EngineCapacity, gpuBlocks}, {m.EngineQueued, waiting}} {
		if f.v < 0 {
			f.g.DeleteLabelValues(s, e)
			continue
		}
		f.g.WithLabelValues(s, e).Set(float64(f.v))
	}
}

// SetProbe publishes a probe result; changed counts a transition.
func (m *Metrics) SetProbe(service, epIdx int, up, changed bool) {
	s, e := itoa(service), itoa(epIdx)
	m.ProbeUp.WithLabelValues(s, e).Set(b2f(up))
	if changed {
		to := "down"
		if up {
			to = "up"
		}
		m.ProbeTransitions.WithLabelValues(s, e, to).Inc()
	}
}

// SetAdminDown publishes the endpoint's admin state.
func (m *Metrics) SetAdminDown(service, epIdx int, down bool) {
	m.AdminDown.WithLabelValues(itoa(service), itoa(epIdx)).Set(b2f(down))
}

// Data path.

// SetDatapath marks path ("sockmap" or "userspace") as the one in use.
func (m *Metrics) SetDatapath(path string) {
	m.DatapathInfo.Reset()
	m.DatapathInfo.WithLabelValues(path).Set(1)
}

// AddSplicedBytes adds body bytes moved on path (the userspace copy counts here).
func (m *Metrics) AddSplicedBytes(path string, n uint64) { m.spliced.add(path, n) }

// SetSplicedBytesSource makes kvgate_spliced_bytes_total{path} read fn at
// scrape time (the sockmap figure comes from BPF counters). fn must be
// monotonic and cheap; nil removes the source.
func (m *Metrics) SetSplicedBytesSource(path string, fn func() uint64) { m.spliced.setSource(path, fn) }

// SetReady sets kvgate_ready.
func (m *Metrics) SetReady(ready bool) { m.Ready.Set(b2f(ready)) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// splicedBytes is kvgate_spliced_bytes_total{path}: bytes added in userspace
// plus, per path, a counter read at scrape time.
type splicedBytes struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	added   map[string]uint64
	sources map[string]func() uint64
}

func newSplicedBytes() *splicedBytes {
	return &splicedBytes{
		desc:    prometheus.NewDesc("kvgate_spliced_bytes_total", "Response body bytes moved backend to client, by data path (sockmap read from BPF counters at scrape time).", []string{"path"}, nil),
		added:   map[string]uint64{"sockmap": 0, "userspace": 0},
		sources: map[string]func() uint64{},
	}
}

func (s *splicedBytes) add(path string, n uint64) {
	s.mu.Lock()
	s.added[path] += n
	s.mu.Unlock()
}

func (s *splicedBytes) setSource(path string, fn func() uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fn == nil {
		delete(s.sources, path)
		return
	}
	s.sources[path] = fn
	if _, ok := s.added[path]; !ok {
		s.added[path] = 0
	}
}

func (s *splicedBytes) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *splicedBytes) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	vals := make(map[string]uint64, len(s.added))
	for p, v := range s.added {
		vals[p] = v
	}
	srcs := make(map[string]func() uint64, len(s.sources))
	for p, fn := range s.sources {
		srcs[p] = fn
	}
	s.mu.Unlock()
	for p, fn := range srcs {
		vals[p] += fn() // called without the lock: a source may be slow
	}
	for p, v := range vals {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(v), p)
	}
}

// Parity self-check (docs/parity.md).

// ParityCheckedInc counts one checked BlockStored of (service, epIdx).
func (m *Metrics) ParityCheckedInc(service, epIdx int) {
	m.ParityChecked.WithLabelValues(itoa(service), itoa(epIdx)).Inc()
}

// ParityUncheckedInc counts one BlockStored that could not be checked.
func (m *Metrics) ParityUncheckedInc(service, epIdx int, cause string) {
	m.ParityUnchecked.WithLabelValues(itoa(service), itoa(epIdx), cause).Inc()
}

// ParityMismatchInc counts one BlockStored whose hashes differ, by reason.
func (m *Metrics) ParityMismatchInc(service, epIdx int, reason string) {
	m.ParityMismatch.WithLabelValues(itoa(service), itoa(epIdx), reason).Inc()
}

// SetParityState sets kvgate_kv_parity_state (-1, 0 or 1).
func (m *Metrics) SetParityState(service, epIdx, state int) {
	m.ParityState.WithLabelValues(itoa(service), itoa(epIdx)).Set(float64(state))
}

// Panicked implements recovery.Observer: kvgate_panics_total{where}.
func (m *Metrics) Panicked(where string) { m.Panics.WithLabelValues(where).Inc() }
