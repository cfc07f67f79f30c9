package selector

import "github.com/kvgate/kvgate/pkg/epset"

// Sessions across replicas (docs/replicas.md, "Sessions"): with
// Options.SessionHash, a conversation this replica has not pinned yet gets
// its tier-1 pair from its key alone, by rendezvous hashing over the
// eligible endpoints under a bounded-load cap. Every replica that numbers
// endpoints alike (a --rules-file fixes ep_idx) and sees similar loads (the
// shared load view) derives the same pair, so a conversation whose turns
// reach different replicas stays on one endpoint without any shared memory.

// decodeSalt separates the decode pick from the prefill pick of one key.
const decodeSalt = 0x5851f42d4c957f2d

// sessionHash is FNV-1a of the key: fixed, with no per-process seed, so
// every replica hashes a key alike.
func sessionHash(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return mix64(h)
}

// sessionHome derives a key's (prefill, decode) pair over the eligible
// prefill and decode sets; sc.load must hold their loads. -1 when a set is
// empty.
func (s *Selector) sessionHome(key string, prefE, decE epset.Set, sc *scratch) (prefill, decode int) {
	h := sessionHash(key)
	return boundedHashPick(prefE, h, sc, s.opts.MeanLoadFactor), boundedHashPick(decE, h^decodeSalt, sc, s.opts.MeanLoadFactor)
}

// boundedHashPick is consistent hashing with bounded loads: the endpoint of
// highest rendezvous weight among those whose load is under
// cap = ceil(mlf · (L + 1) / (100 · n)), L the set's total load and n its
// size. The cap's sum exceeds L, so some endpoint is always under it; a
// key moves only when its endpoint leaves or fills up.
func boundedHashPick(set epset.Set, h uint64, sc *scratch, mlf int) int {
	members := list(set, &sc.memb)
	if len(members) == 0 {
		return -1
	}
	var total int64
	for _, m := range members {
		total += sc.load[m]
	}
	n := int64(len(members))
	capacity := (int64(mlf)*(total+1) + 100*n - 1) / (100 * n)
	best, bw := -1, uint64(0)
	for _, m := range members {
		if sc.load[m] >= capacity {
			continue
		}
		if w := rendezvousWeight(h, int(m)); best < 0 || w > bw {
			best, bw = int(m), w
		}
	}
	return best
}
