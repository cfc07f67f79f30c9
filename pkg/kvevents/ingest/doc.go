// Package ingest follows engines' KV-event streams and applies them to a
// rule's inventory: one ZeroMQ SUB per (endpoint, data-parallel rank), the
// 64-batch sequence window, bootstrap and gap repair over the engine's replay
// socket, and the Ingester that turns decoded batches into Sink calls. The
// wire codec it uses is the parent package kvevents.
//
// Knobs (set by the daemon from its environment, see docs/ingest.md):
// Options.ReplayPortOffset (LLB_KV_REPLAY_PORT_OFFSET), the dial, replay and
// reconnect timeouts in Options. Metrics: none directly; Observer reports
// connections, sequence cases, clears, replays and decode errors, and the
// daemon exports them through pkg/metrics.
package ingest
