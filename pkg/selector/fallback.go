package selector

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"

	"github.com/kvgate/kvgate/pkg/epset"
)

// rrPick returns the k-th member of set for a round-robin cursor, or -1.
func rrPick(set epset.Set, cursor *atomic.Uint64) int {
	n := set.Len()
	if n == 0 {
		return -1
	}
	k := int((cursor.Add(1) - 1) % uint64(n))
	ep := set.Next(0)
	for ; k > 0; k-- {
		ep = set.Next(ep + 1)
	}
	return ep
}

// pickTied returns tied[rr % n]; the cursor advances only on a genuine tie.
func pickTied(tied []int16, cursor *atomic.Uint64) int {
	if len(tied) == 1 {
		return int(tied[0])
	}
	k := (cursor.Add(1) - 1) % uint64(len(tied))
	return int(tied[k])
}

// minLoad is tier 2 (and the decode choice): the endpoint of set with the
// lowest in-flight + queued, round-robin among ties. queued is
// vllm:num_requests_waiting; a sample older than QueueStaleAfter (or never
// scraped) is replaced by the mean of the fresh samples in set (floored; 0
// when none is fresh). Loads must already be in sc.load.
func (s *Selector) minLoad(set epset.Set, sc *scratch, cursor *atomic.Uint64) int {
	if set.Empty() {
		return -1
	}
	fresh := s.now().Add(-s.opts.QueueStaleAfter)
	var freshSum, nFresh int64
	members := list(set, &sc.memb)
	for _, m := range members {
		ep := int(m)
		q, at, ok := s.engine.Waiting(ep)
		if ok && q >= 0 && !at.Before(fresh) {
			sc.capc[ep] = int64(min(q, maxLoad))
			freshSum += sc.capc[ep]
			nFresh++
		} else {
			sc.capc[ep] = -1
		}
	}
	var mean int64
	if nFresh > 0 {
		mean = freshSum / nFresh
	}
	n := 0
	best := int64(-1)
	for _, m := range members {
		ep := int(m)
		q := sc.capc[ep]
		if q < 0 {
			q = mean
		}
		v := sc.load[ep] + q
		switch {
		case best < 0 || v < best:
			best, n = v, 0
			sc.tied[n] = int16(ep)
			n++
		case v == best:
			sc.tied[n] = int16(ep)
			n++
		}
	}
	return pickTied(sc.tied[:n], cursor)
}

// addrHash is FNV-1a over the 16-byte form of the client address.
func addrHash(a netip.Addr) uint64 {
	if !a.IsValid() {
		return 0
	}
	b := a.As16()
	h := uint64(14695981039346656037)
	for _, x := range b {
		h ^= uint64(x)
		h *= 1099511628211
	}
	return h
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// hashPick is rendezvous (highest-random-weight) hashing of the client
// address over set: stable per client, and only the clients of an endpoint
// that leaves move.
func hashPick(set epset.Set, h uint64) int {
	best, bw := -1, uint64(0)
	var buf [8]byte
	for ep := set.Next(0); ep >= 0; ep = set.Next(ep + 1) {
		binary.LittleEndian.PutUint64(buf[:], uint64(ep))
		w := mix64(h ^ mix64(binary.LittleEndian.Uint64(buf[:])+0x9e3779b97f4a7c15))
		if best < 0 || w > bw {
			best, bw = ep, w
		}
	}
	return best
}

// selectBySel is the single-pool fallback, the rule's sel:
//
//	0 round-robin; 1 hash of the client address; 2 priority (highest weight,
//	ties to the lowest ep_idx); 3 persist (a client sticks to its endpoint for
//	the session TTL; new clients round-robin); 4 least connections
//	(round-robin among ties); 5 n2 and 6 n3 and 10 wrr-hash: hash of the
//	client address; 7 reserved: round-robin; 8 chwbl and 9 gpuaware: least
//	in-flight per unit of capacity (L_i/ĉ_i), round-robin among ties.
func (s *Selector) selectBySel(a *Attempt, c *compiled, elig epset.Set, sc *scratch) int {
	switch c.rule.Sel {
	case SelHash, SelN2, SelN3, SelWRRHash:
		return hashPick(elig, addrHash(a.req.Client))
	case SelPriority:
		best := -1
		for ep := elig.Next(0); ep >= 0; ep = elig.Next(ep + 1) {
			if best < 0 || c.weight[ep] > c.weight[best] {
				best = ep
			}
		}
		return best
	case SelPersist:
		if a.req.Client.IsValid() {
			s.mu.Lock()
			ep, _, ok := s.persist.get(a.req.Client, s.elapsed(), c.ttl)
			s.mu.Unlock()
			if ok && elig.Has(ep) {
				return ep
			}
		}
		return rrPick(elig, &s.rrSel)
	case SelLeastConn:
		n := 0
		for ep := elig.Next(0); ep >= 0; ep = elig.Next(ep + 1) {
			if n == 0 || sc.load[ep] < sc.load[sc.tied[0]] {
				n = 0
				sc.tied[n] = int16(ep)
				n++
			} else if sc.load[ep] == sc.load[sc.tied[0]] {
				sc.tied[n] = int16(ep)
				n++
			}
		}
		return pickTied(sc.tied[:n], &s.rrSel)
	case SelCHWBL, SelGPUAware:
		n := 0
		for ep := elig.Next(0); ep >= 0; ep = elig.Next(ep + 1) {
			sc.capc[ep] = s.capacity(c, ep)
			if n == 0 {
				sc.tied[0] = int16(ep)
				n = 1
				continue
			}
			t := int(sc.tied[0])
			// Compare L_ep/ĉ_ep with L_t/ĉ_t by cross-multiplication.
			l, r := sc.load[ep]*sc.capc[t], sc.load[t]*sc.capc[ep]
			if l < r {
				sc.tied[0] = int16(ep)
				n = 1
			} else if l == r {
				sc.tied[n] = int16(ep)
				n++
			}
		}
		return pickTied(sc.tied[:n], &s.rrSel)
	}
	return rrPick(elig, &s.rrSel)
}
