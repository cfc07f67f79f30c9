package selector

import "time"

// lruEntry is one entry of an lru; the list is ordered by last access, most
// recent at the front, so the tail is the oldest.
type lruEntry[K comparable] struct {
	key        K
	a, b       int16
	last       time.Duration
	prev, next *lruEntry[K]
}

// lru is a bounded map with a sliding idle timeout, evicting the entry with
// the oldest last access when full. It backs the tier-1 session table and
// the sel=3 persist table. Not safe for concurrent use.
type lru[K comparable] struct {
	m    map[K]*lruEntry[K]
	head lruEntry[K] // sentinel: head.next is the newest, head.prev the oldest
	max  int
}

func newLRU[K comparable](max int) *lru[K] {
	l := &lru[K]{m: make(map[K]*lruEntry[K]), max: max}
	l.head.next, l.head.prev = &l.head, &l.head
	return l
}

func (l *lru[K]) len() int { return len(l.m) }

func (l *lru[K]) unlink(e *lruEntry[K]) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (l *lru[K]) pushFront(e *lruEntry[K]) {
	e.prev, e.next = &l.head, l.head.next
	l.head.next.prev = e
	l.head.next = e
}

// get returns the entry's values and refreshes its last access (sliding
// TTL). An entry idle for more than ttl is removed and reported absent.
func (l *lru[K]) get(k K, now, ttl time.Duration) (a, b int, ok bool) {
	e := l.m[k]
	if e == nil {
		return 0, 0, false
	}
	if now-e.last > ttl {
		l.remove(k)
		return 0, 0, false
	}
	e.last = now
	l.unlink(e)
	l.pushFront(e)
	return int(e.a), int(e.b), true
}

// put inserts or updates k, evicting the oldest entry when full; it reports
// whether an entry was evicted.
func (l *lru[K]) put(k K, a, b int, now time.Duration) (evicted bool) {
	if e := l.m[k]; e != nil {
		e.a, e.b, e.last = int16(a), int16(b), now
		l.unlink(e)
		l.pushFront(e)
		return false
	}
	if len(l.m) >= l.max {
		oldest := l.head.prev
		l.unlink(oldest)
		delete(l.m, oldest.key)
		evicted = true
	}
	e := &lruEntry[K]{key: k, a: int16(a), b: int16(b), last: now}
	l.m[k] = e
	l.pushFront(e)
	return evicted
}

func (l *lru[K]) remove(k K) {
	if e := l.m[k]; e != nil {
		l.unlink(e)
		delete(l.m, k)
	}
}

// dropIf removes every entry whose values match.
func (l *lru[K]) dropIf(match func(a, b int) bool) {
	for e := l.head.next; e != &l.head; {
		next := e.next
		if match(int(e.a), int(e.b)) {
			l.unlink(e)
			delete(l.m, e.key)
		}
		e = next
	}
}
