package fullproxy

import "github.com/kvgate/kvgate/pkg/datapath"

// BodyAuditor may read the response bodies the proxy relays, for the
// per-request usage audit (docs/parity.md, "Per-request usage audit"). The
// daemon implements it in pkg/gateway; it must be safe for concurrent use.
type BodyAuditor interface {
	// Tap returns a tap for the body of resp, the answer to rec's request,
	// about to be moved by the body leg named leg ("userspace" or
	// "sockmap"); nil leaves the body alone. A tapped body is copied in
	// userspace (datapath.Options.Tap).
	Tap(rec *Record, resp *BackendResponse, leg string) BodyTap
}

// BodyTap sees one response body as it is relayed.
type BodyTap interface {
	// Write gets the payload of the body written to the client, its HTTP
	// framing removed (the tap need not know chunked encoding); it must not
	// keep p.
	Write(p []byte)
	// Done is called once when the body leg ended.
	Done(res datapath.Result)
}

// bodyTap asks the auditor for a tap on r, unless the request's usage was
// audited from another leg.
func (x *Exchange) bodyTap(r *BackendResponse) BodyTap {
	a := x.s.cfg.BodyAuditor
	if a == nil || x.Record.UsageAudited {
		return nil
	}
	return a.Tap(x.Record, r, x.s.leg.Path())
}
