package fullproxy

import (
	"github.com/kvgate/kvgate/pkg/datapath"
	"github.com/kvgate/kvgate/pkg/fullproxy/internal/http1"
)

// NewBodyEnd returns the datapath.BodyEnd the proxy gives a body leg for a
// response body: chunked, or of the declared length (-1: until the backend
// closes); eventStream for text/event-stream, whose broken streams end with
// an error event. The proxy makes one per relayed response (Exchange.Relay);
// a harness that drives a body leg without the proxy (bench/datapath) uses
// it to relay bodies as kvgate does (docs/body-leg.md, "Broken responses").
func NewBodyEnd(chunked bool, contentLength int64, eventStream bool) datapath.BodyEnd {
	return http1.NewBodyFraming(chunked, contentLength, eventStream)
}
