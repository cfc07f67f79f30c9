package tokenizer

import "sync"

// maxPooledIDs bounds the id buffers an IDPool keeps (a 1M-token prompt):
// a larger buffer is left to the GC rather than pinned for the next request.
const maxPooledIDs = 1 << 20

// IDPool recycles prompt id buffers between requests, for callers of
// AppendChat and AppendPromptLimited that are done with the ids once the
// block hashes are computed (the router): a warm 100k-token chat then
// reuses a 400 KB array instead of allocating one (docs/tokenizer.md,
// "Decision cost at long context"). The zero value is ready; it is safe for
// concurrent use. Put only buffers nothing reads any more: a buffer handed
// out again is overwritten.
type IDPool struct {
	p sync.Pool // *[]uint32
}

// Get returns an empty buffer, reused when one was put back (nil otherwise;
// the Append functions then allocate).
func (p *IDPool) Get() []uint32 {
	if b, ok := p.p.Get().(*[]uint32); ok {
		return (*b)[:0]
	}
	return nil
}

// Put gives ids back for reuse; the caller must not read or write it after.
func (p *IDPool) Put(ids []uint32) {
	if cap(ids) == 0 || cap(ids) > maxPooledIDs {
		return
	}
	ids = ids[:0]
	p.p.Put(&ids)
}
