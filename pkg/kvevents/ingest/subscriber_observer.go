package ingest

import "github.com/kvgate/kvgate/pkg/inventory"

// EndpointRef names a subscribed endpoint in metrics: labels service (the
// rule's service id), ep and ep_idx (both the decimal ep_idx, as the reference
// gateway labels them) and, for loxilb_pd_ep_info, ep holding the IP.
type EndpointRef struct {
	Service uint32
	EPIdx   int
	IP      string
}

// ClearReason says why a rank's inventory was cleared by the subscriber
// (AllBlocksCleared events from the engine are not counted here).
type ClearReason uint8

const (
	ClearLargeGap ClearReason = iota + 1 // gap beyond the window that replay could not repair
	ClearRestart                         // the sequence went back, or the replay showed another history: the engine restarted
	// ClearUnverified: the engine's health probe saw it come back and there
	// is no replay endpoint to check whether it is the same engine.
	ClearUnverified
)

func (r ClearReason) String() string {
	switch r {
	case ClearLargeGap:
		return "large_gap"
	case ClearRestart:
		return "restart"
	case ClearUnverified:
		return "unverified"
	}
	return "unknown"
}

// ReplayPurpose says why a replay exchange ran.
type ReplayPurpose uint8

const (
	ReplayBootstrap ReplayPurpose = iota + 1 // from sequence 0 on the first connect
	ReplayGap                                // repair of a sequence gap
	ReplayRestart                            // resync from 0 after an engine restart
	ReplayVerify                             // after a reconnect or probe-up: is it still the same engine?
)

func (p ReplayPurpose) String() string {
	switch p {
	case ReplayBootstrap:
		return "bootstrap"
	case ReplayGap:
		return "gap"
	case ReplayRestart:
		return "restart"
	case ReplayVerify:
		return "verify"
	}
	return "unknown"
}

// Observer receives the subscribers' metrics. Methods are called from the
// subscriber goroutines without locks held; implementations must be safe for
// concurrent use and must not block. The daemon wires it to pkg/metrics:
//
//	EndpointInfo / EndpointGone → loxilb_pd_ep_info{service,ep_idx,ep=IP} = 1 / series deleted
//	                              (Gone also retires every other series of the endpoint)
//	Connected                   → loxilb_kv_subscriber_connected{service,ep} (1 when every rank is connected)
//	RankConnected               → kvgate_kv_subscriber_rank_connected{service,ep,rank}
//	Reconnected                 → loxilb_kv_subscriber_reconnect_total{service,ep}
//	RecvError                   → loxilb_kv_subscriber_recv_error_total{service,ep}
//	Blocks                      → loxilb_pd_kv_blocks{service,ep_idx}
//	CapEvicted                  → loxilb_kv_inv_cap_evictions_total{service,ep}
//	Sequence                    → kvgate_kv_subscriber_gaps_total{service,ep,kind}
//	                              (kind: small, large, restart) and
//	                              kvgate_kv_seq_missing_total{service,ep} += missing
//	Cleared                     → kvgate_kv_subscriber_clears_total{service,ep,reason}
//	Replay                      → kvgate_kv_subscriber_replays_total{service,ep,outcome=ok|error}
//	                              and kvgate_kv_subscriber_replayed_batches_total{service,ep} += batches
//	DecodeError                 → kvgate_kv_decode_errors_total{service,ep} (and recv_error)
type Observer interface {
	EndpointInfo(ep EndpointRef)
	EndpointGone(ep EndpointRef)
	Connected(ep EndpointRef, up bool)
	RankConnected(ep EndpointRef, rank int, up bool)
	Reconnected(ep EndpointRef)
	RecvError(ep EndpointRef)
	Blocks(ep EndpointRef, blocks int)
	CapEvicted(ep EndpointRef, n int)
	Sequence(ep EndpointRef, rank int, c SeqCase, missing uint64)
	Cleared(ep EndpointRef, rank int, reason ClearReason)
	Replay(ep EndpointRef, rank int, purpose ReplayPurpose, ok bool, batches int)
	DecodeError(ep EndpointRef, rank int)
}

// BatchObserver is an optional extension of Observer: an Observer that also
// implements it is told of the live batches applied (replayed batches go to
// Replay) and the hashes their BlockStored and BlockRemoved events carried:
// after each batch while the rank's queue is empty, every 64 batches while
// a backlog is applied.
// The daemon wires it to kvgate_kv_subscriber_batches_total{service,ep} and
// kvgate_kv_subscriber_hashes_total{service,ep,event}, the counters an
// operator (and bench/ingest) reads the ingest rate from. It is a separate
// interface so Observers that do not count batches need not change.
type BatchObserver interface {
	Applied(ep EndpointRef, rank int, batches, stored, removed int)
}

// NopObserver ignores everything; embed it to implement part of Observer.
type NopObserver struct{}

func (NopObserver) EndpointInfo(EndpointRef)                          {}
func (NopObserver) EndpointGone(EndpointRef)                          {}
func (NopObserver) Connected(EndpointRef, bool)                       {}
func (NopObserver) RankConnected(EndpointRef, int, bool)              {}
func (NopObserver) Reconnected(EndpointRef)                           {}
func (NopObserver) RecvError(EndpointRef)                             {}
func (NopObserver) Blocks(EndpointRef, int)                           {}
func (NopObserver) CapEvicted(EndpointRef, int)                       {}
func (NopObserver) Sequence(EndpointRef, int, SeqCase, uint64)        {}
func (NopObserver) Cleared(EndpointRef, int, ClearReason)             {}
func (NopObserver) Replay(EndpointRef, int, ReplayPurpose, bool, int) {}
func (NopObserver) DecodeError(EndpointRef, int)                      {}

// InventoryObserver adapts obs to the inventory's observer for one rule, so
// cap evictions reach loxilb_kv_inv_cap_evictions_total{service,ep}. Pass it
// in inventory.Options when creating the rule's index.
func InventoryObserver(obs Observer, service uint32) inventory.Observer {
	return inventoryObserver{obs: obs, service: service}
}

type inventoryObserver struct {
	obs     Observer
	service uint32
}

func (o inventoryObserver) CapEvicted(ep, n int) {
	o.obs.CapEvicted(EndpointRef{Service: o.service, EPIdx: ep}, n)
}
