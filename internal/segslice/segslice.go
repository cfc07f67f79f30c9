// Package segslice holds read-only sequences made of shared segments. A
// cache entry that extends an earlier one (the next turn of a conversation)
// keeps the earlier entry's storage for the shared prefix and copies only
// its new elements, instead of copying the whole sequence again per request
// (docs/tokenizer.md, "Decision cost at long context").
package segslice

import "slices"

// MaxSegments bounds the segments of one Slice: an Extend past it copies
// the sequence into one segment, so reads stay a short loop and a long
// conversation does not pin many small arrays.
const MaxSegments = 64

// Slice is an immutable sequence of T. Its zero value is empty. Segments are
// never written after they are made, so Slices sharing them may be read
// concurrently.
type Slice[T comparable] struct {
	segs []segment[T]
	n    int
}

type segment[T any] struct {
	data []T // non-empty, capacity clipped to its length
	held int // elements of the array data keeps alive (for the memory bound)
}

// Of returns a Slice holding a copy of s.
func Of[T comparable](s []T) Slice[T] { return Slice[T]{}.Extend(s) }

// Len is the number of elements.
func (s Slice[T]) Len() int { return s.n }

// Held is the number of elements of the arrays s keeps alive, at least
// Len: the memory bound of a cache counts it, since a prefix keeps its
// whole segment alive.
func (s Slice[T]) Held() int {
	h := 0
	for _, g := range s.segs {
		h += g.held
	}
	return h
}

// Prefix is the first n elements of s (all of them when n ≥ Len), sharing
// s's storage.
func (s Slice[T]) Prefix(n int) Slice[T] {
	if n >= s.n {
		return s
	}
	if n <= 0 {
		return Slice[T]{}
	}
	out := Slice[T]{segs: make([]segment[T], 0, len(s.segs)+1), n: n}
	for _, g := range s.segs {
		if n <= len(g.data) {
			out.segs = append(out.segs, segment[T]{data: g.data[:n:n], held: g.held})
			break
		}
		out.segs = append(out.segs, g)
		n -= len(g.data)
	}
	return out
}

// Extend is s followed by a copy of tail; s is unchanged.
func (s Slice[T]) Extend(tail []T) Slice[T] {
	if len(tail) == 0 {
		return s
	}
	if len(s.segs)+1 > MaxSegments {
		all := s.AppendTo(make([]T, 0, s.n+len(tail)), s.n)
		all = append(all, tail...)
		return Slice[T]{segs: []segment[T]{{data: all[:len(all):len(all)], held: cap(all)}}, n: len(all)}
	}
	segs := make([]segment[T], len(s.segs), len(s.segs)+1)
	copy(segs, s.segs)
	c := slices.Clone(tail)
	return Slice[T]{segs: append(segs, segment[T]{data: c[:len(c):len(c)], held: cap(c)}), n: s.n + len(tail)}
}

// ExtendOwned is s followed by tail itself, not a copy: the caller gives
// tail up and must not write to it again.
func (s Slice[T]) ExtendOwned(tail []T) Slice[T] {
	if len(tail) == 0 {
		return s
	}
	if len(s.segs)+1 > MaxSegments {
		return s.Extend(tail)
	}
	segs := make([]segment[T], len(s.segs), len(s.segs)+1)
	copy(segs, s.segs)
	return Slice[T]{segs: append(segs, segment[T]{data: tail[:len(tail):len(tail)], held: cap(tail)}), n: s.n + len(tail)}
}

// AppendTo appends the first n elements of s (at most Len) to dst.
func (s Slice[T]) AppendTo(dst []T, n int) []T {
	for _, g := range s.segs {
		if n <= 0 {
			break
		}
		k := min(n, len(g.data))
		dst = append(dst, g.data[:k]...)
		n -= k
	}
	return dst
}

// Range appends elements lo..hi-1 of s to dst (0 ≤ lo ≤ hi ≤ Len).
func (s Slice[T]) Range(dst []T, lo, hi int) []T {
	off := 0
	for _, g := range s.segs {
		if off >= hi {
			break
		}
		end := off + len(g.data)
		if end > lo {
			dst = append(dst, g.data[max(lo-off, 0):min(hi-off, len(g.data))]...)
		}
		off = end
	}
	return dst
}

// CommonPrefix is the length of the longest common prefix of s and b,
// compared a thousand elements at a time (element by element cost more in
// loop overhead than comparing on a 100k-token prompt).
func (s Slice[T]) CommonPrefix(b []T) int {
	done := 0
	for _, g := range s.segs {
		k := commonPrefix(g.data, b[done:])
		done += k
		if k < len(g.data) {
			break
		}
	}
	return done
}

func commonPrefix[T comparable](a, b []T) int {
	n := min(len(a), len(b))
	const span = 1024
	i := 0
	for i+span <= n && slices.Equal(a[i:i+span], b[i:i+span]) {
		i += span
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
