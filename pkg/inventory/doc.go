// Package inventory is the block-hash inventory of one rule: which endpoint
// (and data-parallel rank) holds which vLLM KV block, mirrored from the
// engines' KV events, and the scorer the selector asks for a prompt's
// overlap.
//
// All endpoints of a rule share one Index, an open-addressing table keyed by
// block hash whose slots carry an interned holder set, so Score looks each
// prompt block up once for every endpoint and does not allocate. Writers
// (pkg/kvevents/ingest) mutate it in bounded chunks so scoring never waits
// behind a whole batch, a clear or a rehash; each endpoint is capped at
// LOXILB_KV_MAX_BLOCKS, oldest first. Non-GPU media are kept in tables of
// their own; those that map to a slower tier (tiers.go) extend the scored
// leading run at their LLB_KV_TIER_WEIGHTS weight.
//
// docs/ingest.md ("Inventory index design") explains the layout, the locking
// and the measurements behind them.
package inventory
