// Package epset is the endpoint bitset shared across kvgate: eligibility and
// exclusion masks, inventory membership and score filters all use it, so a
// mask built by the proxy can be handed to the inventory and the selector
// without conversion.
//
// An endpoint is named by its ep_idx, which the rule model allocates once and
// never reuses while the rule lives.
package epset

import (
	"math/bits"
	"strconv"
	"strings"
)

// Max is the number of endpoints a set can hold, and so the most a rule can have.
const Max = 256

const words = Max / 64

// Set is a fixed-size bitset of ep_idx values in [0, Max). The zero value is
// the empty set. It is a value type: copy it freely.
type Set [words]uint64

// Of returns the set holding the given indices. Out-of-range indices are ignored.
func Of(idx ...int) Set {
	var s Set
	for _, i := range idx {
		s.Add(i)
	}
	return s
}

// FirstN returns {0, 1, …, n-1}, clamped to [0, Max].
func FirstN(n int) Set {
	var s Set
	if n > Max {
		n = Max
	}
	for w := 0; n > 0; w++ {
		if n >= 64 {
			s[w] = ^uint64(0)
			n -= 64
			continue
		}
		s[w] = (uint64(1) << uint(n)) - 1
		n = 0
	}
	return s
}

// Add puts i in the set; an index outside [0, Max) is ignored.
func (s *Set) Add(i int) {
	if uint(i) < Max {
		s[i>>6] |= 1 << (uint(i) & 63)
	}
}

// Remove takes i out of the set.
func (s *Set) Remove(i int) {
	if uint(i) < Max {
		s[i>>6] &^= 1 << (uint(i) & 63)
	}
}

// Has reports whether i is in the set.
func (s Set) Has(i int) bool {
	return uint(i) < Max && s[i>>6]&(1<<(uint(i)&63)) != 0
}

// Len is the number of members.
func (s Set) Len() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// Empty reports whether the set has no members.
func (s Set) Empty() bool { return s == Set{} }

// And returns s ∩ o.
func (s Set) And(o Set) Set {
	for i := range s {
		s[i] &= o[i]
	}
	return s
}

// Or returns s ∪ o.
func (s Set) Or(o Set) Set {
	for i := range s {
		s[i] |= o[i]
	}
	return s
}

// AndNot returns s \ o.
func (s Set) AndNot(o Set) Set {
	for i := range s {
		s[i] &^= o[i]
	}
	return s
}

// Min returns the lowest member, or -1 for the empty set.
func (s Set) Min() int {
	for w, v := range s {
		if v != 0 {
			return w*64 + bits.TrailingZeros64(v)
		}
	}
	return -1
}

// Next returns the lowest member ≥ i, or -1 when there is none. Iterate with
// for i := s.Next(0); i >= 0; i = s.Next(i + 1).
func (s Set) Next(i int) int {
	if i < 0 {
		i = 0
	}
	for w := i >> 6; w < words; w++ {
		v := s[w]
		if w == i>>6 {
			v &= ^uint64(0) << (uint(i) & 63)
		}
		if v != 0 {
			return w*64 + bits.TrailingZeros64(v)
		}
	}
	return -1
}

// Slice lists the members in ascending order.
func (s Set) Slice() []int {
	out := make([]int, 0, s.Len())
	for i := s.Next(0); i >= 0; i = s.Next(i + 1) {
		out = append(out, i)
	}
	return out
}

// String renders the set as "{0,3,7}" for logs and test failures.
func (s Set) String() string {
	var b strings.Builder
	b.WriteByte('{')
	for i := s.Next(0); i >= 0; i = s.Next(i + 1) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteByte('}')
	return b.String()
}
