package chattemplate

import (
	"slices"
	"unsafe"
)

// output is what a render writes into: strings.Builder's append-only buffer,
// except that it can start from a caller's buffer, so a caller rendering
// 400 KB prompts can reuse one array instead of allocating one per request
// (AppendRenderChat; docs/tokenizer.md, "Decision cost at long context").
// Bytes once written are never changed by output, which is what makes
// String's zero-copy view safe, as it is for strings.Builder.
type output struct {
	buf []byte
}

func (o *output) WriteString(s string) { o.buf = append(o.buf, s...) }

func (o *output) grow(n int) { o.buf = slices.Grow(o.buf, n) }

// String is the bytes written so far, sharing the buffer. A caller that
// handed its own buffer in must not write to it while the string is in use.
func (o *output) String() string { return unsafe.String(unsafe.SliceData(o.buf), len(o.buf)) }
