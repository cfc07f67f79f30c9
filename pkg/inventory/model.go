package inventory

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"
)

// ModelSalt keys one model's blocks apart from every other model's in a
// shared index: a block of model M is stored and scored under hash ^ salt(M),
// so two models that share a tokenizer and a seed (and so compute the same
// hash for the same prompt) never score for each other. XOR keeps the key a
// bijection of the hash, so a snapshot maps back exactly (Unkey). The zero
// salt is "no model known" and leaves hashes as the engine publishes them
// (docs/selection.md, "Many models behind one rule").
type ModelSalt uint64

// SaltFor is the salt of a base model name; "" has the zero salt.
func SaltFor(model string) ModelSalt {
	if model == "" {
		return 0
	}
	sum := sha256.Sum256([]byte("kvgate-model\x00" + model))
	s := ModelSalt(binary.LittleEndian.Uint64(sum[:8]))
	if s == 0 {
		s = 1 // a named model never shares the unnamed key space
	}
	return s
}

// Key is h's key under the salt.
func (s ModelSalt) Key(h uint64) uint64 { return h ^ uint64(s) }

// KeyAll rewrites hashes in place into their keys under the salt.
func (s ModelSalt) KeyAll(hashes []uint64) {
	if s == 0 {
		return
	}
	for i := range hashes {
		hashes[i] ^= uint64(s)
	}
}

// Unkey maps keys back to the engine's hashes in place (XOR is its own inverse).
func (s ModelSalt) Unkey(keys []uint64) { s.KeyAll(keys) }

// BlockSink is where an endpoint's KV events land: an *Index, or the
// provisional *Overlay over it (which confirms its predictions first).
type BlockSink interface {
	Add(ep, rank int, medium string, hashes []uint64) error
	Remove(ep, rank int, medium string, hashes []uint64) error
	ClearRank(ep, rank int) error
	ClearEndpoint(ep int) error
	Blocks(ep int) int
}

// ModelSink is one endpoint's writer into a shared index under its model's
// salt: the ingest side of the keying. It is a comparable value (Inner is a
// pointer), so a subscriber whose endpoint starts serving another base
// model is a changed target and restarts (its old blocks cleared, the new
// ones replayed under the new key).
type ModelSink struct {
	Inner BlockSink
	Salt  ModelSalt
}

// keyScratch recycles the keyed copies of event batches: the caller's slice
// is not ours to rewrite.
var keyScratch = sync.Pool{New: func() any { b := make([]uint64, 0, 256); return &b }}

func (m ModelSink) keyed(hashes []uint64, f func([]uint64) error) error {
	if m.Salt == 0 {
		return f(hashes)
	}
	bp := keyScratch.Get().(*[]uint64)
	*bp = append((*bp)[:0], hashes...)
	m.Salt.KeyAll(*bp)
	err := f(*bp)
	if cap(*bp) <= 1<<16 { // a huge batch's buffer is not kept
		keyScratch.Put(bp)
	}
	return err
}

// Add records hashes of (ep, rank) under the salt.
func (m ModelSink) Add(ep, rank int, medium string, hashes []uint64) error {
	return m.keyed(hashes, func(k []uint64) error { return m.Inner.Add(ep, rank, medium, k) })
}

// Remove forgets hashes of (ep, rank) under the salt.
func (m ModelSink) Remove(ep, rank int, medium string, hashes []uint64) error {
	return m.keyed(hashes, func(k []uint64) error { return m.Inner.Remove(ep, rank, medium, k) })
}

// ExpectStored passes a burst's reservation to the inner sink when it takes
// one: the salt changes the hashes, not how many there are.
func (m ModelSink) ExpectStored(ep, n int) {
	if r, ok := m.Inner.(BurstReserver); ok {
		r.ExpectStored(ep, n)
	}
}

// ClearRank forgets every block of (ep, rank).
func (m ModelSink) ClearRank(ep, rank int) error { return m.Inner.ClearRank(ep, rank) }

// ClearEndpoint forgets every block of ep.
func (m ModelSink) ClearEndpoint(ep int) error { return m.Inner.ClearEndpoint(ep) }

// Blocks counts the blocks ep holds.
func (m ModelSink) Blocks(ep int) int { return m.Inner.Blocks(ep) }

// OtherMediaBlocks counts ep's blocks on media other than the GPU when the
// inner sink counts them (ingest reports it as kvgate_kv_blocks_other_medium).
func (m ModelSink) OtherMediaBlocks(ep int) int {
	if o, ok := m.Inner.(interface{ OtherMediaBlocks(ep int) int }); ok {
		return o.OtherMediaBlocks(ep)
	}
	return 0
}
