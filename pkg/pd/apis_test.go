package pd

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestConversationAPIsTakeThePlainPath: P/D mode 1 orchestrates
// /v1/completions and /v1/chat/completions only (docs/pd.md, "Which requests
// take the two legs"); a /v1/messages or /v1/responses request goes whole,
// unchanged, to the chosen prefill endpoint, which serves it as a complete
// engine, and no decode endpoint sees it.
func TestConversationAPIsTakeThePlainPath(t *testing.T) {
	tests := []struct{ path, body string }{
		{"/v1/messages", `{"model":"m","max_tokens":16,"system":"s","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"m","instructions":"s","input":"hi"}`},
		{"/v1/responses", `{"model":"m","input":[{"role":"user","content":"hi"}],"stream":true}`},
	}
	for _, tc := range tests {
		t.Run(tc.path+" "+tc.body[len(tc.body)-20:], func(t *testing.T) {
			r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){decodeOK("p0"), decodeOK("d1"), decodeOK("p2")}, prefillRoles(), rigOptions{})
			r.url = strings.Replace(r.url, "/v1/completions", tc.path, 1)
			a := r.post(tc.body)
			if a.err != nil || a.status != 200 {
				t.Fatalf("%d %v %s", a.status, a.err, a.body)
			}
			var legs []seen
			for _, e := range []*engine{r.eps[0], r.eps[2]} {
				legs = append(legs, e.seen()...)
			}
			if len(legs) != 1 || legs[0].path != tc.path || !bytes.Equal(legs[0].raw, []byte(tc.body)) {
				for _, l := range legs {
					t.Logf("saw %s %s", l.path, l.raw)
				}
				t.Fatalf("prefill endpoints saw %d requests, want the body once, unchanged, at %s", len(legs), tc.path)
			}
			if n := len(r.eps[1].seen()); n != 0 {
				t.Fatalf("the decode endpoint saw %d requests", n)
			}
			if r.obs.get("leg:prefill") != 0 {
				t.Fatal("a prefill leg ran")
			}
			r.atRest()
		})
	}
}
