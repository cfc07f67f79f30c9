package datapath

// BodyEnd tells a body leg where the response body it moves ends. The legs
// know nothing of the HTTP framing: the proxy, which parsed the response
// head, makes one BodyEnd per response (package fullproxy builds it from
// the body's framing) and passes it in Options.End; a leg feeds it the
// bytes it relays, asks it whether the body is complete, and takes from it
// the bytes that end a broken stream (docs/body-leg.md, "Broken
// responses"). A BodyEnd serves one response and one leg at a time.
type BodyEnd interface {
	// Feed takes the next bytes the backend sent and returns how many of
	// them belong to the body: fewer than len(p) once the body is complete
	// (the rest is not the client's) or its framing broke (State().Err).
	Feed(p []byte) int
	// Skip accounts for n body bytes that moved without being fed (in the
	// kernel), of which the leg kept only the last ones: tail ends the body
	// so far, fed bytes included, and whole says it is the entire body.
	// Feed takes no bytes after Skip.
	Skip(n int64, tail []byte, whole bool)
	// State is where the body stands after the bytes fed and skipped.
	State() BodyState
	// BrokenEnd returns the bytes a leg writes to the client when the
	// backend broke the body where it stands now, carrying why (an event
	// stream's final error event), or nil when no byte can follow cleanly.
	BrokenEnd(why string) []byte
}

// BodyState is what a BodyEnd knows of its body.
type BodyState struct {
	// Complete: the body ended by its own framing.
	Complete bool
	// Delimited: the body carries its own end, so a backend EOF before it
	// is BackendBroken; otherwise the backend's close ends the body.
	Delimited bool
	// Seen is the number of body bytes fed or skipped.
	Seen int64
	// Err is the malformed framing that stopped Feed (BackendBroken).
	Err error
}

// untilClose is the BodyEnd of a body that ends when the backend closes:
// every byte belongs to it, none can end it early.
type untilClose struct{ seen int64 }

func (u *untilClose) Feed(p []byte) int              { u.seen += int64(len(p)); return len(p) }
func (u *untilClose) Skip(n int64, _ []byte, _ bool) { u.seen += n }
func (u *untilClose) State() BodyState               { return BodyState{Seen: u.seen} }
func (*untilClose) BrokenEnd(string) []byte          { return nil }

// WithEnd returns opts with End set: the given one, or, when nil, one for
// a body that ends when the backend closes. A leg calls it once per body,
// so that a leg it hands the body to continues with the same BodyEnd.
func (o Options) WithEnd() Options {
	if o.End == nil {
		o.End = &untilClose{}
	}
	return o
}
