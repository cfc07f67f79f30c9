package ingest

import (
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

// Parity check: every BlockStored that carries its token ids lets kvgate
// recompute the block hashes under the rule's contract and compare them with
// the engine's. A wrong seed, algorithm, block size or LoRA handling would
// otherwise score 0 overlap and silently turn the rule into round-robin.
// See docs/parity.md, "Live parity self-check".

// Mismatch reasons (label reason of kvgate_kv_parity_mismatch_total).
const (
	ParitySeed        = "seed"
	ParityAlgo        = "algo"
	ParityBlockSize   = "block_size"
	ParityGranularity = "granularity"
	ParityLoRA        = "lora"
	ParityUnknown     = "unknown"
)

// Unchecked causes (label cause of kvgate_kv_parity_unchecked_total).
const (
	UncheckedNoTokenIDs    = "no_token_ids"
	UncheckedParentUnknown = "parent_unknown"
	UncheckedSampledOut    = "sampled_out"
)

const (
	// parityAlwaysCheck is how many BlockStored events after each connect
	// are checked whatever the sampling budget.
	parityAlwaysCheck = 8
	// parityBrokenAfter consecutive mismatches set the state to -1.
	parityBrokenAfter = 3
	// parityOKQuiet is how long without a mismatch a match needs to set 1.
	parityOKQuiet = 60 * time.Second
	// parityLogEvery bounds the diagnosis log per endpoint.
	parityLogEvery = time.Minute
	// paritySearchEvery bounds the candidate search per endpoint.
	paritySearchEvery = 10 * time.Second
	// parityDigestCache bounds the per-rank map from a checked block's
	// 64-bit hash to its full digest (the parent of the next event).
	parityDigestCache = 2048
	// DefaultParityBudget is the blocks per second a rank checks beyond
	// the first events after a connect.
	DefaultParityBudget = 4096
	// maxParitySeed is the last numeric seed the diagnosis tries ("0".."999").
	maxParitySeed = 999
	// maxParityBlockSize bounds the event block size the diagnosis tries.
	maxParityBlockSize = 4096
)

// ParityObserver receives the parity metrics; the daemon maps it to
//
//	Checked   → kvgate_kv_parity_checked_total{service,ep_idx}
//	Unchecked → kvgate_kv_parity_unchecked_total{service,ep_idx,cause}
//	Mismatch  → kvgate_kv_parity_mismatch_total{service,ep_idx,reason}
//	State     → kvgate_kv_parity_state{service,ep_idx} (-1 broken, 0 unknown, 1 ok)
//
// Calls come from subscriber and diagnosis goroutines; they must not block.
type ParityObserver interface {
	ParityChecked(ep EndpointRef)
	ParityUnchecked(ep EndpointRef, cause string)
	ParityMismatch(ep EndpointRef, reason string)
	ParityState(ep EndpointRef, state int)
}

// ParityOptions configure a rule's Parity.
type ParityOptions struct {
	Service uint32
	// Hasher is the rule's contract (nil: no check is possible, and every
	// event is unchecked).
	Hasher *kvhash.Hasher
	// SeedSource names where the rule's seed comes from in the fix text:
	// "LLB_KV_NONE_HASH_SEED" (default) or "kvHashSeed".
	SeedSource string
	// Budget is the blocks per second per rank checked after the first
	// events of a connect (default DefaultParityBudget; negative: only
	// those first events).
	Budget   int
	Logger   *slog.Logger
	Observer ParityObserver
	// Now is the clock (default time.Now); tests step it.
	Now func() time.Time
}

// Parity is one rule's live parity self-check. Safe for concurrent use.
type Parity struct {
	opts ParityOptions

	mu  sync.Mutex
	eps map[int]*epParity
}

// epParity is one endpoint's verdict, shared by its ranks.
type epParity struct {
	ref          EndpointRef
	consecutive  int
	lastMismatch time.Time
	matched      bool
	state        int
	lastLog      time.Time
	lastSearch   time.Time
	searching    bool
	// found is the contract the last search named: later mismatches it
	// reproduces get its reason without a new search.
	found    *candidate
	diagnose string // the last diagnosis sentence, for the preflight
}

// ParityStatus is one endpoint's state, for the preflight.
type ParityStatus struct {
	EPIdx      int
	State      int // -1 broken, 0 unknown, 1 ok
	Checked    bool
	Diagnosis  string
	Mismatches int // consecutive
}

// NewParity returns the check for one rule.
func NewParity(opts ParityOptions) *Parity {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Budget == 0 {
		opts.Budget = DefaultParityBudget
	}
	if opts.SeedSource == "" {
		opts.SeedSource = "LLB_KV_NONE_HASH_SEED"
	}
	return &Parity{opts: opts, eps: map[int]*epParity{}}
}

// Status reports the state of every endpoint heard from.
func (p *Parity) Status() []ParityStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ParityStatus, 0, len(p.eps))
	for idx, e := range p.eps {
		out = append(out, ParityStatus{EPIdx: idx, State: e.state, Checked: e.matched || e.consecutive > 0,
			Diagnosis: e.diagnose, Mismatches: e.consecutive})
	}
	return out
}

// Contract is the rule's contract (zero when the rule has no hasher).
func (p *Parity) Contract() kvhash.Contract {
	if p.opts.Hasher == nil {
		return kvhash.Contract{}
	}
	return p.opts.Hasher.Contract()
}

func (p *Parity) endpoint(ref EndpointRef) *epParity {
	e, ok := p.eps[ref.EPIdx]
	if !ok {
		e = &epParity{ref: ref}
		p.eps[ref.EPIdx] = e
		if p.opts.Observer != nil {
			p.opts.Observer.ParityState(ref, 0)
		}
	}
	return e
}

// forget drops an endpoint that left the rule.
func (p *Parity) forget(ep int) {
	p.mu.Lock()
	delete(p.eps, ep)
	p.mu.Unlock()
}

// rank returns the per-rank checker an Ingester uses.
func (p *Parity) rank(ref EndpointRef) *parityRank {
	p.mu.Lock()
	p.endpoint(ref)
	p.mu.Unlock()
	return &parityRank{p: p, ref: ref, digests: make(map[uint64]digestEntry, 64)}
}

type digestEntry struct {
	d [32]byte
	n uint8
}

// parityRank is one rank's check state; owned by the rank's goroutine.
type parityRank struct {
	p   *Parity
	ref EndpointRef

	sinceConnect int // BlockStored events seen since the last connect
	tokens       float64
	last         time.Time

	digests map[uint64]digestEntry
	ring    []uint64 // insertion order, for eviction
	ringPos int

	chain   []kvhash.Block // scratch
	scratch []byte         // the digests of the event being checked
}

// connected restarts the always-check window.
func (r *parityRank) connected() { r.sinceConnect = 0 }

func (r *parityRank) observer() ParityObserver { return r.p.opts.Observer }

func (r *parityRank) unchecked(cause string) {
	if o := r.observer(); o != nil {
		o.ParityUnchecked(r.ref, cause)
	}
}

// allow reports whether an event of n blocks fits the sampling budget.
func (r *parityRank) allow(n int) bool {
	r.sinceConnect++
	if r.sinceConnect <= parityAlwaysCheck {
		return true
	}
	b := r.p.opts.Budget
	if b < 0 {
		return false
	}
	now := r.p.opts.Now()
	if !r.last.IsZero() {
		r.tokens = min(float64(b), r.tokens+now.Sub(r.last).Seconds()*float64(b))
	} else {
		r.tokens = float64(b)
	}
	r.last = now
	if r.tokens < float64(n) {
		return false
	}
	r.tokens -= float64(n)
	return true
}

// check verifies one primary-group GPU BlockStored.
func (r *parityRank) check(e *kvevents.Event) {
	h := r.p.opts.Hasher
	if len(e.TokenIDs) == 0 || len(e.BlockHashes) == 0 || h == nil {
		r.unchecked(UncheckedNoTokenIDs)
		return
	}
	var parent []byte
	if e.HasParent {
		d, ok := r.digests[e.ParentBlockHash]
		if !ok {
			r.sinceConnect++ // an event seen counts toward the window
			r.unchecked(UncheckedParentUnknown)
			return
		}
		parent = d.d[:d.n]
	}
	if !r.allow(len(e.BlockHashes)) {
		r.unchecked(UncheckedSampledOut)
		return
	}
	c := h.Contract()
	ebs := c.BlockSize
	if e.HasBlockSize && e.BlockSize > 0 {
		ebs = e.BlockSize
	}
	if ebs%c.BlockSize != 0 {
		r.mismatch(e, parent, ParityBlockSize)
		return
	}
	if len(e.TokenIDs) != len(e.BlockHashes)*ebs {
		r.mismatch(e, parent, ParityGranularity)
		return
	}
	k := ebs / c.BlockSize
	extra := kvhash.Extra{LoRAName: e.LoRAName}
	if parent == nil {
		// Block 0 may carry the request's cache_salt in its extra keys.
		salt, ok := firstBlockSalt(e.ExtraKeys, e.LoRAName)
		if !ok {
			r.unchecked(UncheckedNoTokenIDs) // the keys hold more than strings (multimodal): ids alone do not decide
			return
		}
		extra.CacheSalt = salt
	}
	r.chain = r.chain[:0]
	ok := true
	p := parent
	base := 1 // a chained event's first block is not the request's block 0
	if parent == nil {
		base = 0
	}
	// Digests land in one reused buffer, so a check does not allocate in
	// steady state.
	dl := h.DigestLen()
	if need := len(e.BlockHashes) * k * dl; cap(r.scratch) < need {
		r.scratch = make([]byte, need)
	}
	for i := range len(e.BlockHashes) * k {
		d, u := h.Extend(p, base+i, e.TokenIDs[i*c.BlockSize:(i+1)*c.BlockSize], extra, r.scratch[i*dl:i*dl:(i+1)*dl])
		p = d
		if (i+1)%k == 0 {
			if u != e.BlockHashes[i/k] {
				ok = false
				break
			}
			r.chain = append(r.chain, kvhash.Block{Index: i / k, Digest: d, Hash: u})
		}
	}
	if !ok {
		r.mismatch(e, parent, "")
		return
	}
	for _, b := range r.chain {
		r.remember(b.Hash, b.Digest)
	}
	if o := r.observer(); o != nil {
		o.ParityChecked(r.ref)
	}
	r.p.verdict(r.ref, true)
}

// remember caches a checked block's digest, evicting the oldest when full.
func (r *parityRank) remember(hash uint64, d []byte) {
	if _, ok := r.digests[hash]; ok {
		return
	}
	if len(r.ring) < parityDigestCache {
		r.ring = append(r.ring, hash)
	} else {
		delete(r.digests, r.ring[r.ringPos])
		r.ring[r.ringPos] = hash
		r.ringPos = (r.ringPos + 1) % parityDigestCache
	}
	var de digestEntry
	de.n = uint8(copy(de.d[:], d))
	r.digests[hash] = de
}

// mismatch records a failed check. reason, when the cheap tests decided it
// (block size, granularity), is counted now; otherwise a cached diagnosis
// or a search off the ingest path names it.
func (r *parityRank) mismatch(e *kvevents.Event, parent []byte, reason string) {
	if o := r.observer(); o != nil {
		o.ParityChecked(r.ref)
	}
	// The diagnosis hashes the first block only: keep just what it reads.
	job := diagJob{
		tokens:    append([]uint32(nil), e.TokenIDs[:min(len(e.TokenIDs), maxParityBlockSize)]...),
		hashes:    append([]uint64(nil), e.BlockHashes[0]),
		nHashes:   len(e.BlockHashes),
		nTokens:   len(e.TokenIDs),
		blockSize: e.BlockSize,
		lora:      e.LoRAName,
		chained:   parent != nil,
	}
	if !e.HasBlockSize {
		job.blockSize = 0
	}
	r.p.mismatch(r.ref, job, reason)
}

// verdict folds one check result into the endpoint's state.
func (p *Parity) verdict(ref EndpointRef, match bool) {
	now := p.opts.Now()
	p.mu.Lock()
	e := p.endpoint(ref)
	if match {
		e.consecutive = 0
		e.matched = true
	} else {
		e.consecutive++
		e.lastMismatch = now
	}
	st := 0
	switch {
	case e.consecutive >= parityBrokenAfter:
		st = -1
	case match && (e.lastMismatch.IsZero() || now.Sub(e.lastMismatch) >= parityOKQuiet):
		st = 1
	}
	changed := st != e.state
	e.state = st
	p.mu.Unlock()
	if changed && p.opts.Observer != nil {
		p.opts.Observer.ParityState(ref, st)
	}
}

type diagJob struct {
	tokens    []uint32 // the event's first tokens, at most maxParityBlockSize
	hashes    []uint64 // the event's first hash
	nHashes   int      // the event's counts, for the granularity sentence
	nTokens   int
	blockSize int // the event's block_size (0: absent)
	lora      string
	chained   bool
}

// candidate is a contract the diagnosis tries.
type candidate struct {
	algo      kvhash.Algo
	seed      kvhash.Seed
	blockSize int
	// dropLora: the engine does not hash the event's LoRA name, loraName.
	dropLora bool
	loraName string
}

func (p *Parity) mismatch(ref EndpointRef, job diagJob, reason string) {
	p.verdict(ref, false)
	now := p.opts.Now()
	p.mu.Lock()
	e := p.endpoint(ref)
	found := e.found
	if reason != "" {
		found = nil // a cheap test decided (the event's own block_size explains it)
	}
	search := false
	if reason == "" && found != nil && !job.chained && reproduces(*found, job) {
		reason = p.reasonOf(*found)
	}
	if reason == "" && !e.searching && !job.chained && (e.lastSearch.IsZero() || now.Sub(e.lastSearch) >= paritySearchEvery) {
		e.searching, e.lastSearch, search = true, now, true
	}
	if reason != "" {
		// Decided without a search: still log it, once a minute.
		if e.lastLog.IsZero() || now.Sub(e.lastLog) >= parityLogEvery {
			e.lastLog = now
			e.diagnose = p.sentence(ref, reason, found, job)
			p.opts.Logger.Warn("kv parity: the engine's block hashes differ from kvgate's; requests to it score no overlap",
				"service", ref.Service, "ep_idx", ref.EPIdx, "reason", reason, "fix", e.diagnose)
		}
	}
	p.mu.Unlock()
	if search {
		go p.search(ref, job)
		return
	}
	if reason == "" {
		reason = ParityUnknown
	}
	if p.opts.Observer != nil {
		p.opts.Observer.ParityMismatch(ref, reason)
	}
}

// search tries candidate contracts on the event's first block (parent
// NONE_HASH) and names the one that reproduces the engine's hash. Its cost
// is bounded: 4 algorithms × 1,003 seeds × at most 2 block sizes × at most 2
// LoRA names, one block each, at most once per endpoint per
// paritySearchEvery, on its own goroutine.
func (p *Parity) search(ref EndpointRef, job diagJob) {
	c := p.Contract()
	found, ok := findCandidate(c, job)
	reason := ParityUnknown
	var fp *candidate
	if ok {
		fp = &found
		reason = p.reasonOf(found)
		if reason == "" { // the rule's own contract reproduces block 0: a later block differs
			reason, fp = ParityUnknown, nil
		}
	}
	now := p.opts.Now()
	p.mu.Lock()
	e := p.endpoint(ref)
	e.searching = false
	if fp != nil {
		e.found = fp
	}
	logIt := e.lastLog.IsZero() || now.Sub(e.lastLog) >= parityLogEvery
	if logIt {
		e.lastLog = now
		e.diagnose = p.sentence(ref, reason, fp, job)
	}
	msg := e.diagnose
	p.mu.Unlock()
	if logIt {
		p.opts.Logger.Warn("kv parity: the engine's block hashes differ from kvgate's; requests to it score no overlap",
			"service", ref.Service, "ep_idx", ref.EPIdx, "reason", reason, "fix", msg)
	}
	if p.opts.Observer != nil {
		p.opts.Observer.ParityMismatch(ref, reason)
	}
}

// reasonOf names what differs between the rule's contract and cand ("" if nothing).
func (p *Parity) reasonOf(cand candidate) string {
	c := p.Contract()
	switch {
	case cand.blockSize != c.BlockSize:
		return ParityBlockSize
	case cand.algo != c.Algo:
		return ParityAlgo
	case cand.seed != c.Seed && !sameEffectiveSeed(cand.seed, c.Seed, c.Algo):
		return ParitySeed
	case cand.dropLora:
		return ParityLoRA
	}
	return ""
}

func sameEffectiveSeed(a, b kvhash.Seed, algo kvhash.Algo) bool {
	ea, eb := a.Value, b.Value
	if !a.Set {
		ea = kvhash.DefaultSHA256Seed
	}
	if !b.Set {
		eb = kvhash.DefaultSHA256Seed
	}
	return ea == eb && (a.Set && b.Set || algo == kvhash.SHA256 || algo == kvhash.SHA256CBOR)
}

// candidateSeeds is the search's seed list: the rule's, "0".."999", unset, "".
func candidateSeeds(rule kvhash.Seed) []kvhash.Seed {
	seeds := make([]kvhash.Seed, 0, maxParitySeed+4)
	seeds = append(seeds, rule)
	for i := 0; i <= maxParitySeed; i++ {
		seeds = append(seeds, kvhash.SeedOf(strconv.Itoa(i)))
	}
	return append(seeds, kvhash.Seed{}, kvhash.SeedOf(""))
}

// findCandidate searches in an order that names the smallest difference:
// block size and LoRA under the rule's algorithm and seed first, then the
// seeds of the rule's algorithm, then the other algorithms.
func findCandidate(c kvhash.Contract, job diagJob) (candidate, bool) {
	sizes := []int{c.BlockSize}
	if job.blockSize > 0 && job.blockSize != c.BlockSize && job.blockSize <= maxParityBlockSize {
		sizes = append(sizes, job.blockSize)
	}
	drops := []bool{false}
	if job.lora != "" {
		drops = append(drops, true)
	}
	algos := []kvhash.Algo{c.Algo}
	for _, a := range []kvhash.Algo{kvhash.SHA256CBOR, kvhash.XXHashCBOR, kvhash.SHA256, kvhash.XXHash} {
		if a != c.Algo {
			algos = append(algos, a)
		}
	}
	seeds := candidateSeeds(c.Seed)
	for _, a := range algos {
		for _, s := range seeds {
			for _, bs := range sizes {
				for _, drop := range drops {
					cand := candidate{algo: a, seed: s, blockSize: bs, dropLora: drop}
					if drop {
						cand.loraName = job.lora
					}
					if reproduces(cand, job) {
						return cand, true
					}
				}
			}
		}
	}
	return candidate{}, false
}

// reproduces reports whether cand hashes the job's first block (parent
// NONE_HASH) to the engine's first hash. For a block size below the event's,
// the engine's first hash is the chain's k-th.
func reproduces(cand candidate, job diagJob) bool {
	if job.chained || cand.blockSize < 1 {
		return false
	}
	h, err := kvhash.New(kvhash.Contract{Algo: cand.algo, BlockSize: cand.blockSize, Seed: cand.seed})
	if err != nil {
		return false
	}
	ebs := job.blockSize
	if ebs <= 0 {
		ebs = cand.blockSize
	}
	if ebs%cand.blockSize != 0 || len(job.tokens) < ebs {
		return false
	}
	extra := kvhash.Extra{LoRAName: job.lora}
	if cand.dropLora {
		extra.LoRAName = ""
	}
	var parent []byte
	var u uint64
	for i := 0; i < ebs/cand.blockSize; i++ {
		parent, u = h.Extend(parent, i, job.tokens[i*cand.blockSize:(i+1)*cand.blockSize], extra, nil)
	}
	return u == job.hashes[0]
}

// sentence is the diagnosis: what the engine does, what kvgate has, what to change.
func (p *Parity) sentence(ref EndpointRef, reason string, cand *candidate, job diagJob) string {
	c := p.Contract()
	ip := ref.IP
	if ip == "" {
		ip = "ep_idx " + strconv.Itoa(ref.EPIdx)
	}
	switch {
	case reason == ParityGranularity:
		return fmt.Sprintf("engine %s publishes %d token ids for %d hashes of block_size %d; kvgate cannot line them up with kvBlockSize=%d",
			ip, job.nTokens, job.nHashes, job.blockSize, c.BlockSize)
	case reason == ParityBlockSize && cand == nil:
		return fmt.Sprintf("engine %s publishes block_size %d, not a multiple of the rule's kvBlockSize=%d; set kvBlockSize to the engine's --block-size (or its prefix_match_unit)",
			ip, job.blockSize, c.BlockSize)
	case cand == nil:
		msg := fmt.Sprintf("engine %s hashes with no contract kvgate tried (algorithms sha256_cbor, xxhash_cbor, sha256, xxhash; seeds the rule's, \"0\" to \"999\", unset, \"\"; block sizes %d and the event's)", ip, c.BlockSize)
		return msg + "; if the engine runs xxhash or xxhash_cbor with PYTHONHASHSEED unset, vLLM draws a random NONE_HASH that no router can reproduce: set PYTHONHASHSEED on the engine and " + p.opts.SeedSource + " to the same value"
	}
	switch reason {
	case ParityBlockSize:
		return fmt.Sprintf("engine %s hashes blocks of %d tokens (--block-size %d); the rule has kvBlockSize=%d", ip, cand.blockSize, cand.blockSize, c.BlockSize)
	case ParityAlgo:
		s := fmt.Sprintf("engine %s hashes with --prefix-caching-hash-algo %s; the rule has kvHashAlgo=%s", ip, cand.algo, c.Algo)
		if !sameEffectiveSeed(cand.seed, c.Seed, cand.algo) {
			s += fmt.Sprintf(" (and PYTHONHASHSEED=%s; kvgate has %s=%s)", seedText(cand.seed), p.opts.SeedSource, seedText(c.Seed))
		}
		return s
	case ParitySeed:
		return fmt.Sprintf("engine %s hashes with PYTHONHASHSEED=%s; kvgate has %s=%s", ip, seedText(cand.seed), p.opts.SeedSource, seedText(c.Seed))
	case ParityLoRA:
		return fmt.Sprintf("engine %s does not hash its LoRA name %q into the blocks it announces under it; kvgate does, as vLLM does", ip, cand.loraName)
	}
	return fmt.Sprintf("engine %s: block hashes differ from kvgate's (%s)", ip, c)
}

func seedText(s kvhash.Seed) string {
	if !s.Set {
		return "unset"
	}
	if s.Value == "" {
		return `""`
	}
	return s.Value
}

// firstBlockSalt reads the cache_salt from the raw msgpack extra_keys of a
// BlockStored (one entry per block: nil or an array of keys; vLLM puts the
// LoRA name first and the salt last, on block 0 only). ok is false when the
// first entry holds anything but strings, such as multimodal hashes.
func firstBlockSalt(raw []byte, lora string) (salt string, ok bool) {
	if len(raw) == 0 || raw[0] == 0xc0 {
		return "", true
	}
	n, off, ok := msgpackArray(raw, 0)
	if !ok {
		return "", false
	}
	if n == 0 || off >= len(raw) || raw[off] == 0xc0 {
		return "", true
	}
	keys, off, ok := msgpackArray(raw, off)
	if !ok {
		return "", false
	}
	for i := 0; i < keys; i++ {
		s, next, ok := msgpackStr(raw, off)
		if !ok {
			return "", false
		}
		off = next
		if i == 0 && s == lora && lora != "" {
			continue
		}
		salt = s
	}
	return salt, true
}

func msgpackArray(b []byte, off int) (n, next int, ok bool) {
	if off >= len(b) {
		return 0, 0, false
	}
	switch c := b[off]; {
	case c >= 0x90 && c <= 0x9f:
		return int(c & 0x0f), off + 1, true
	case c == 0xdc && off+3 <= len(b):
		return int(b[off+1])<<8 | int(b[off+2]), off + 3, true
	case c == 0xdd && off+5 <= len(b):
		return int(b[off+1])<<24 | int(b[off+2])<<16 | int(b[off+3])<<8 | int(b[off+4]), off + 5, true
	}
	return 0, 0, false
}

func msgpackStr(b []byte, off int) (s string, next int, ok bool) {
	if off >= len(b) {
		return "", 0, false
	}
	n, start := 0, 0
	switch c := b[off]; {
	case c >= 0xa0 && c <= 0xbf:
		n, start = int(c&0x1f), off+1
	case c == 0xd9 && off+2 <= len(b):
		n, start = int(b[off+1]), off+2
	case c == 0xda && off+3 <= len(b):
		n, start = int(b[off+1])<<8|int(b[off+2]), off+3
	case c == 0xdb && off+5 <= len(b):
		n, start = int(b[off+1])<<24|int(b[off+2])<<16|int(b[off+3])<<8|int(b[off+4]), off+5
	default:
		return "", 0, false
	}
	if start+n > len(b) {
		return "", 0, false
	}
	return string(b[start : start+n]), start + n, true
}
