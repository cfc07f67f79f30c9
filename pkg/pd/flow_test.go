package pd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/health"
	"github.com/kvgate/kvgate/pkg/pd/admission"
	"github.com/kvgate/kvgate/pkg/selector"
)

const clientBody = `{"model":"m","prompt":"hello world","max_tokens":7,"max_completion_tokens":7,"min_tokens":2,"min_completion_tokens":2,"stream":true,"stream_options":{"include_usage":true},"temperature":0}`

// TestTwoLegRewrite: the prefill leg carries vLLM's proxy rewrite, the
// decode leg the original body plus the prefill's params verbatim, both the
// same X-Request-Id; the client gets the decode stream.
func TestTwoLegRewrite(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 32), decodeOK("d1"), prefillOK("p2", 0)},
		prefillRoles(), rigOptions{})
	a := r.post(clientBody, "X-Request-Id", "client-id-1")
	if a.err != nil || a.status != 200 {
		t.Fatalf("answer %d %v %s", a.status, a.err, a.body)
	}
	if !strings.Contains(string(a.body), "data: [DONE]") || a.header.Get("x-engine-id") != "d1" {
		t.Fatalf("client did not get the decode stream: %q %v", a.body, a.header)
	}
	var p seen
	prefillEP := -1
	for _, i := range []int{0, 2} {
		if s := r.eps[i].seen(); len(s) == 1 {
			p, prefillEP = s[0], i
		}
	}
	if prefillEP < 0 {
		t.Fatalf("no prefill endpoint got exactly one request")
	}
	if got := a.header.Get("x-kvgate-decision"); !strings.Contains(got, fmt.Sprintf("ep=%d;", prefillEP)) || !strings.Contains(got, "decode=1") {
		t.Fatalf("decision header %q", got)
	}
	kv, _ := p.body["kv_transfer_params"].(map[string]any)
	if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false {
		t.Fatalf("prefill kv_transfer_params %v", kv)
	}
	for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
		if v, ok := kv[k]; !ok || v != nil {
			t.Fatalf("prefill kv_transfer_params[%s] = %v, want null", k, v)
		}
	}
	if p.body["stream"] != false || p.body["max_tokens"] != 1.0 || p.body["max_completion_tokens"] != 1.0 {
		t.Fatalf("prefill body %s", p.raw)
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		if _, ok := p.body[k]; ok {
			t.Fatalf("prefill body keeps %s: %s", k, p.raw)
		}
	}
	if p.body["temperature"] != 0.0 || p.body["prompt"] != "hello world" {
		t.Fatalf("prefill body lost client fields: %s", p.raw)
	}
	ds := r.eps[1].seen()
	if len(ds) != 1 {
		t.Fatalf("decode got %d requests", len(ds))
	}
	d := ds[0]
	if d.id != "client-id-1" || p.id != "client-id-1" {
		t.Fatalf("request ids: prefill %q decode %q, want the client's", p.id, d.id)
	}
	for _, k := range []string{"stream", "stream_options", "max_tokens", "max_completion_tokens", "min_tokens", "min_completion_tokens"} {
		var orig map[string]any
		_ = json.Unmarshal([]byte(clientBody), &orig)
		if fmt.Sprint(d.body[k]) != fmt.Sprint(orig[k]) {
			t.Fatalf("decode %s = %v, want the client's %v", k, d.body[k], orig[k])
		}
	}
	dkv, _ := d.body["kv_transfer_params"].(map[string]any)
	if dkv["remote_engine_id"] != fmt.Sprintf("p%d", prefillEP) || dkv["do_remote_prefill"] != true || dkv["tp_size"] != 1.0 {
		t.Fatalf("decode kv_transfer_params not the prefill's verbatim: %v", dkv)
	}
	r.atRest() // the request's accounting ends after the client has read the stream
	if r.obs.get("committed") != 1 || r.obs.get("kv_params:true") != 1 || r.obs.get("request:complete:success") != 1 {
		t.Fatalf("observer: %v", r.obs.n)
	}
	r.atRest()
}

// TestGeneratedRequestIDAndReceipt: without a client id both legs share a
// generated UUID; with pd_request_id_receipt the receipt form names both
// endpoints (nixl_port, else targetPort).
func TestGeneratedRequestIDAndReceipt(t *testing.T) {
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for _, receipt := range []bool{false, true} {
		t.Run(strconv.FormatBool(receipt), func(t *testing.T) {
			r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)},
				prefillRoles(), rigOptions{receipt: receipt, nixlPorts: map[int]int{1: 5557}})
			a := r.post(`{"model":"m","prompt":"x"}`, "X-Request-Id", "ignored-with-receipt")
			if a.status != 200 {
				t.Fatalf("%d %s", a.status, a.body)
			}
			var pid string
			pe := 0
			for _, i := range []int{0, 2} {
				if s := r.eps[i].seen(); len(s) == 1 {
					pid, pe = s[0].id, i
				}
			}
			did := r.eps[1].seen()[0].id
			if pid != did {
				t.Fatalf("prefill id %q != decode id %q", pid, did)
			}
			if !receipt {
				if pid != "ignored-with-receipt" {
					t.Fatalf("id %q, want the client's", pid)
				}
				return
			}
			want := fmt.Sprintf(`^___prefill_addr_%s:%d___decode_addr_%s:5557_[0-9a-f]{32}$`, regexp.QuoteMeta(r.eps[pe].host), r.eps[pe].port, regexp.QuoteMeta(r.eps[1].host))
			if !regexp.MustCompile(want).MatchString(pid) {
				t.Fatalf("receipt id %q, want %s", pid, want)
			}
		})
	}
	if !uuidRE.MatchString(uuidString(newUUID())) {
		t.Fatal("uuidString is not a v4 UUID")
	}
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(), rigOptions{})
	r.post(`{"model":"m","prompt":"x"}`)
	if id := r.eps[1].seen()[0].id; !uuidRE.MatchString(id) {
		t.Fatalf("generated id %q is not a UUID", id)
	}
}

// TestUsageCopiedWhenBuffered: a non-streamed decode answer carries the
// prefill's cached_tokens.
func TestUsageCopiedWhenBuffered(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 32), decodeOK("d1"), prefillOK("p2", 32)}, prefillRoles(), rigOptions{})
	a := r.post(`{"model":"m","prompt":"x","max_tokens":5}`)
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(a.body, &out); err != nil || out.Usage.Details.Cached != 32 || out.Usage.PromptTokens != 40 {
		t.Fatalf("usage not copied: %s", a.body)
	}
	r.atRest()
}

// TestPrefillOutcomes covers the prefill results: 4xx to the client, 5xx and
// connect failure retried on the other prefill endpoint, no params → plain
// decode.
func TestPrefillOutcomes(t *testing.T) {
	fail500 := func(w http.ResponseWriter, _ *http.Request, _ seen) { http.Error(w, `{"error":"boom"}`, 500) }
	bad400 := func(w http.ResponseWriter, _ *http.Request, _ seen) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		fmt.Fprint(w, `{"error":{"message":"min_tokens invalid","code":400}}`)
	}
	noParams := func(w http.ResponseWriter, _ *http.Request, _ seen) {
		fmt.Fprint(w, `{"id":"x","choices":[{"text":"x"}],"kv_transfer_params":null}`)
	}
	for _, tc := range []struct {
		name       string
		p0         func(http.ResponseWriter, *http.Request, seen)
		kill0      bool
		wantStatus int
		wantBody   string
		wantParams bool
		wantObs    []string
	}{
		{name: "4xx", p0: bad400, wantStatus: 400, wantBody: "min_tokens invalid"},
		{name: "5xx", p0: fail500, wantStatus: 200, wantParams: true, wantObs: []string{"failover", "retry:prefill"}},
		{name: "connect", p0: prefillOK("p0", 0), kill0: true, wantStatus: 200, wantParams: true, wantObs: []string{"retry:prefill"}},
		{name: "no-params", p0: noParams, wantStatus: 200, wantParams: false, wantObs: []string{"kv_params:false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p2 := prefillOK("p2", 0)
			if tc.name == "4xx" || tc.name == "no-params" {
				p2 = tc.p0
			}
			r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){tc.p0, decodeOK("d1"), p2}, prefillRoles(), rigOptions{})
			if tc.kill0 {
				r.eps[0].kill()
			}
			// Two requests so Tier 2 round-robin reaches EP0 at least once.
			for i := 0; i < 2; i++ {
				a := r.post(`{"model":"m","prompt":"x"}`)
				if a.status != tc.wantStatus || !strings.Contains(string(a.body), tc.wantBody) {
					t.Fatalf("answer %d %s, want %d containing %q", a.status, a.body, tc.wantStatus, tc.wantBody)
				}
			}
			ds := r.eps[1].seen()
			if tc.wantStatus == 400 {
				if len(ds) != 0 {
					t.Fatalf("decode called after a prefill 4xx")
				}
			} else {
				for _, d := range ds {
					_, has := d.body["kv_transfer_params"]
					if has != tc.wantParams {
						t.Fatalf("decode body kv_transfer_params present=%v, want %v: %s", has, tc.wantParams, d.raw)
					}
				}
			}
			r.atRest()
			for _, k := range tc.wantObs {
				if r.obs.get(k) == 0 {
					t.Fatalf("observer %s not counted: %v", k, r.obs.n)
				}
			}
			if tc.kill0 && len(r.pobs.connFail) == 0 {
				t.Fatal("connect failure not reported to the proxy observer")
			}
			r.atRest()
		})
	}
}

// TestPrefillTimeout: a prefill slower than the bound answers 504
// pd_prefill_timeout within the bound (+1 s), cancels the prefill and
// releases the in-flight counts.
func TestPrefillTimeout(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){hang, decodeOK("d1"), hang}, prefillRoles(),
		rigOptions{cfg: Config{PrefillTimeout: 500 * time.Millisecond}})
	start := time.Now()
	a := r.post(`{"model":"m","prompt":"x"}`)
	el := time.Since(start)
	if a.status != 504 || a.errCode() != "pd_prefill_timeout" {
		t.Fatalf("answer %d %s", a.status, a.body)
	}
	if el > 1500*time.Millisecond {
		t.Fatalf("504 after %v, want within timeout + 1 s", el)
	}
	if len(r.eps[1].seen()) != 0 {
		t.Fatal("decode called after a prefill timeout")
	}
	if r.obs.get("pd_prefill_timeout") != 1 || r.obs.get("request:prefill:timeout") != 1 {
		t.Fatalf("observer %v", r.obs.n)
	}
	r.atRest()
}

// TestDecodeFailures: first-byte timeout → 504 pd_decode_timeout; EOF before
// any byte → 502 pd_decode_backend_died; death mid-stream → the client sees
// the end.
func TestDecodeFailures(t *testing.T) {
	hangup := func(w http.ResponseWriter, _ *http.Request, _ seen) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	}
	midStream := func(w http.ResponseWriter, _ *http.Request, _ seen) {
		c, bw, _ := w.(http.Hijacker).Hijack()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		bw.WriteString("14\r\ndata: {\"text\":\"a\"}\n\n\r\n")
		bw.Flush()
		time.Sleep(50 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	for _, tc := range []struct {
		name     string
		decode   func(http.ResponseWriter, *http.Request, seen)
		status   int
		code     string
		obs      string
		bodyPart string
	}{
		{"first-byte-timeout", hang, 504, "pd_decode_timeout", "pd_decode_timeout", ""},
		{"eof-before-byte", hangup, 502, "pd_decode_backend_died", "zero_byte", ""},
		{"dies-mid-stream", midStream, 200, "", "died:decode", `"text":"a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), tc.decode, prefillOK("p2", 0)}, prefillRoles(),
				rigOptions{cfg: Config{PrefillTimeout: 400 * time.Millisecond}})
			start := time.Now()
			a := r.post(`{"model":"m","prompt":"x","stream":true}`)
			if time.Since(start) > 5*time.Second {
				t.Fatalf("took %v", time.Since(start))
			}
			if tc.status == 200 {
				// The stream breaks: the client sees an error or a short body, never a hang.
				if a.status != 200 || !strings.Contains(string(a.body), tc.bodyPart) {
					t.Fatalf("answer %d %q %v", a.status, a.body, a.err)
				}
			} else if a.status != tc.status || a.errCode() != tc.code {
				t.Fatalf("answer %d %s, want %d %s", a.status, a.body, tc.status, tc.code)
			}
			r.atRest()
			if r.obs.get(tc.obs) == 0 {
				t.Fatalf("observer %s not counted: %v", tc.obs, r.obs.n)
			}
			r.atRest()
		})
	}
}

// TestDecodeSilence: a decode stream silent for LLB_PD_DECODE_SILENCE_SEC is
// ended and counted.
func TestDecodeSilence(t *testing.T) {
	stall := func(w http.ResponseWriter, r *http.Request, _ seen) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), stall, prefillOK("p2", 0)}, prefillRoles(),
		rigOptions{cfg: Config{DecodeSilence: 300 * time.Millisecond}})
	start := time.Now()
	r.post(`{"model":"m","prompt":"x","stream":true}`)
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("silent stream ended after %v", el)
	}
	r.atRest()
	if r.obs.get("pd_decode_stream_timeout") != 1 {
		t.Fatalf("observer %v", r.obs.n)
	}
	r.atRest()
}

// TestDecodeOnlyFallback: with every prefill endpoint down, the plain
// request goes to decode (fallback on) or 503 pd_pool_unavailable (off),
// both for prefill endpoints that refuse connections and for ones the
// probe already marked down.
func TestDecodeOnlyFallback(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fallback  bool
		probeDown bool
	}{
		{"refused/on", true, false}, {"refused/off", false, false},
		{"probe-down/on", true, true}, {"probe-down/off", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(),
				rigOptions{cfg: Config{DecodeOnlyFallback: tc.fallback}})
			r.eps[0].kill()
			r.eps[2].kill()
			if tc.probeDown {
				for i := 0; i < 2; i++ {
					r.tracker.ProbeResult(0, false)
					r.tracker.ProbeResult(2, false)
				}
			}
			a := r.post(clientBody)
			if !tc.fallback {
				if a.status != 503 || a.errCode() != "pd_pool_unavailable" {
					t.Fatalf("answer %d %s", a.status, a.body)
				}
				if len(r.eps[1].seen()) != 0 {
					t.Fatal("decode called with the fallback off")
				}
				r.atRest()
				return
			}
			if a.status != 200 || !strings.Contains(string(a.body), "[DONE]") {
				t.Fatalf("answer %d %s", a.status, a.body)
			}
			d := r.eps[1].seen()[0]
			if string(d.raw) != clientBody {
				t.Fatalf("decode-only body %s, want the client's verbatim", d.raw)
			}
			r.atRest()
			if r.obs.get("decode_only") != 1 {
				t.Fatalf("observer %v", r.obs.n)
			}
			if !strings.Contains(a.header.Get("x-kvgate-decision"), "tier=decode_only") {
				t.Fatalf("decision %q", a.header.Get("x-kvgate-decision"))
			}
			r.atRest()
		})
	}
}

// TestDecodeRechosen: a decode endpoint that goes down during the prefill is
// replaced by another healthy one.
func TestDecodeRechosen(t *testing.T) {
	var rg *rig
	slowPrefill := func(w http.ResponseWriter, req *http.Request, s seen) {
		// The decode chosen at admission goes admin-down while prefill runs.
		rg.tracker.SetAdmin(1, true)
		prefillOK("p0", 0)(w, req, s)
	}
	rg = newRig(t, []func(http.ResponseWriter, *http.Request, seen){slowPrefill, decodeOK("d1"), slowPrefill, decodeOK("d3")},
		[]selector.Role{selector.RolePrefill, selector.RoleDecode, selector.RolePrefill, selector.RoleDecode}, rigOptions{})
	// Make EP1 the decode choice: EP3 carries one unit.
	rg.adm.Track(3)
	a := rg.post(`{"model":"m","prompt":"x"}`)
	rg.adm.Untrack(3)
	if a.status != 200 || a.header.Get("x-engine-id") != "d3" {
		t.Fatalf("answer %d engine %q %s", a.status, a.header.Get("x-engine-id"), a.body)
	}
	if len(rg.eps[1].seen()) != 0 {
		t.Fatal("the admin-down decode endpoint was used")
	}
	rg.atRest()
}

// TestAdmission: at the per-endpoint cap the client gets 429 pd_overloaded
// with Retry-After: 1; with a queue the request parks until a slot frees,
// or times out with 504 pd_admission_park_timeout.
func TestAdmission(t *testing.T) {
	release := make(chan struct{})
	held := func(w http.ResponseWriter, r *http.Request, s seen) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		prefillOK("p", 0)(w, r, s)
	}
	t.Run("shed", func(t *testing.T) {
		r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){held, decodeOK("d1"), held}, prefillRoles(),
			rigOptions{admission: admission.Config{MaxInflightPerEP: 1}})
		done := make(chan answer, 2)
		for i := 0; i < 2; i++ {
			go func() { done <- r.post(`{"model":"m","prompt":"x"}`) }()
		}
		waitUntil(t, func() bool { return r.adm.InFlight(0) == 1 && r.adm.InFlight(2) == 1 })
		a := r.post(`{"model":"m","prompt":"x"}`)
		if a.status != 429 || a.errCode() != "pd_overloaded" || a.header.Get("Retry-After") != "1" {
			t.Fatalf("answer %d %v %s", a.status, a.header, a.body)
		}
		close(release)
		for i := 0; i < 2; i++ {
			if a := <-done; a.status != 200 {
				t.Fatalf("held request: %d %s", a.status, a.body)
			}
		}
		r.atRest()
	})
	t.Run("park", func(t *testing.T) {
		rel := make(chan struct{})
		h := prefillAfter(rel)
		r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){h, decodeOK("d1"), h}, prefillRoles(),
			rigOptions{admission: admission.Config{MaxInflightPerEP: 1, QueueDepthPerEP: 2, MaxPark: 300 * time.Millisecond}})
		done := make(chan answer, 3)
		for i := 0; i < 2; i++ {
			go func() { done <- r.post(`{"model":"m","prompt":"x"}`) }()
		}
		waitUntil(t, func() bool { return r.adm.InFlight(0) == 1 && r.adm.InFlight(2) == 1 })
		// Park timeout.
		a := r.post(`{"model":"m","prompt":"x"}`)
		if a.status != 504 || a.errCode() != "pd_admission_park_timeout" {
			t.Fatalf("answer %d %s", a.status, a.body)
		}
		// A parked request gets the slot freed by a finishing one.
		go func() { done <- r.post(`{"model":"m","prompt":"x"}`) }()
		waitUntil(t, func() bool { return r.adm.Parked(0)+r.adm.Parked(2) == 1 })
		close(rel)
		for i := 0; i < 3; i++ {
			if a := <-done; a.status != 200 {
				t.Fatalf("request %d: %d %s", i, a.status, a.body)
			}
		}
		r.atRest()
	})
	t.Run("total", func(t *testing.T) {
		rel := make(chan struct{})
		h := prefillAfter(rel)
		r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){h, decodeOK("d1"), h}, prefillRoles(),
			rigOptions{admission: admission.Config{MaxTotalInflight: 1}})
		done := make(chan answer, 1)
		go func() { done <- r.post(`{"model":"m","prompt":"x"}`) }()
		waitUntil(t, func() bool { return r.adm.InFlight(0)+r.adm.InFlight(2) == 1 })
		if a := r.post(`{"model":"m","prompt":"x"}`); a.status != 429 || a.header.Get("Retry-After") != "1" {
			t.Fatalf("answer %d %s", a.status, a.body)
		}
		close(rel)
		if a := <-done; a.status != 200 {
			t.Fatalf("%d %s", a.status, a.body)
		}
		r.atRest()
	})
}

// TestPlainPath: requests that are not single-generation JSON take the
// plain path to the prefill endpoint.
func TestPlainPath(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){decodeOK("p0"), decodeOK("d1"), decodeOK("p2")}, prefillRoles(), rigOptions{})
	for _, b := range []string{`{"model":"m","prompt":["a","b"]}`, `{"model":"m","prompt":"x","n":2}`, `not json`} {
		a := r.post(b)
		if a.status != 200 || a.header.Get("x-engine-id") != "p0" {
			t.Fatalf("%s: %d %q", b, a.status, a.header.Get("x-engine-id"))
		}
	}
	// Keep-alive: two P/D requests on one client connection.
	c, err := net.Dial("tcp", r.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		body := `{"model":"m","prompt":"x"}`
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the kept connection: %v", i, err)
		}
		var buf strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&buf)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	r.atRest()
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestNoDecodeEndpoint: with every decode endpoint down no prefill is sent;
// the client gets 503 pd_pool_unavailable.
func TestNoDecodeEndpoint(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(), rigOptions{})
	r.tracker.SetAdmin(1, true)
	a := r.post(`{"model":"m","prompt":"x"}`)
	if a.status != 503 || a.errCode() != "pd_pool_unavailable" {
		t.Fatalf("answer %d %s", a.status, a.body)
	}
	if len(r.eps[0].seen())+len(r.eps[2].seen()) != 0 {
		t.Fatal("a prefill was sent with no decode endpoint to read it")
	}
	r.atRest()
}

// TestOnlyPDTimersBound: the prefill is bounded by LLB_PD_PREFILL_TIMEOUT_SEC
// alone — no proxy timer (response-header wait, stream silence) and no
// hidden reaper cuts a long prefill short, so a 600 s setting works for long
// contexts. Here the proxy's own bounds are 300 ms and the prefill takes 1 s.
func TestOnlyPDTimersBound(t *testing.T) {
	slowOK := func(w http.ResponseWriter, r *http.Request, s seen) {
		time.Sleep(time.Second)
		prefillOK("p", 0)(w, r, s)
	}
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){slowOK, decodeOK("d1"), slowOK}, prefillRoles(),
		rigOptions{cfg: Config{PrefillTimeout: 5 * time.Second},
			limits: fullproxy.Limits{ResponseHeaderTimeout: 300 * time.Millisecond, StreamSilence: 300 * time.Millisecond}})
	if a := r.post(`{"model":"m","prompt":"x"}`); a.status != 200 {
		t.Fatalf("answer %d %s", a.status, a.body)
	}
	r.atRest()
}

// TestClientGoneDuringPrefill: a client that hangs up while its prefill runs
// releases its admission unit at once, and the prefill connection is closed
// (the engine aborts the request), long before the prefill timeout.
func TestClientGoneDuringPrefill(t *testing.T) {
	aborted := make(chan struct{}, 2)
	slow := func(w http.ResponseWriter, r *http.Request, _ seen) {
		select {
		case <-r.Context().Done():
			aborted <- struct{}{}
		case <-time.After(10 * time.Second):
		}
	}
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){slow, decodeOK("d1"), slow}, prefillRoles(),
		rigOptions{cfg: Config{PrefillTimeout: 10 * time.Second}})
	c, err := net.Dial("tcp", r.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","prompt":"x"}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitUntil(t, func() bool { return r.adm.InFlight(0)+r.adm.InFlight(2) == 1 })
	c.Close()
	select {
	case <-aborted:
	case <-time.After(3 * time.Second):
		t.Fatal("the prefill was not abandoned after the client left")
	}
	r.atRest()
}

// TestPipelinedPD: two P/D requests written back to back on one connection
// are both answered, in order (watching the client during the prefill
// leaves the second request buffered).
func TestPipelinedPD(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(), rigOptions{})
	c, err := net.Dial("tcp", r.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	for i := 0; i < 2; i++ {
		body := fmt.Sprintf(`{"model":"m","prompt":"req %d"}`, i)
		fmt.Fprintf(&b, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: r%d\r\nContent-Length: %d\r\n\r\n%s", i, len(body), body)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("response %d: %d %s", i, resp.StatusCode, sb.String())
		}
	}
	ds := r.eps[1].seen()
	if len(ds) != 2 || ds[0].id != "r0" || ds[1].id != "r1" {
		t.Fatalf("decode saw %d requests in order %v", len(ds), ds)
	}
	r.atRest()
}

// BenchmarkExchange compares, side by side on loopback, one P/D request (two
// legs: buffered prefill, then decode relayed) with one request the same
// rule serves on the plain path (a single leg), both on kept-alive client
// connections. The difference is the P/D flow's cost: a second backend
// connection and round trip, the JSON rewrite and the admission bookkeeping.
func BenchmarkExchange(b *testing.B) {
	r := newRig(b, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(), rigOptions{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, bc := range []struct{ name, body string }{
		{"pd", `{"model":"m","prompt":"hello world","max_tokens":8}`},
		{"plain", `{"model":"m","prompt":["hello world","second"],"max_tokens":8}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := client.Post(r.url, "application/json", strings.NewReader(bc.body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = bufio.NewReader(resp.Body).WriteTo(io.Discard)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatal(resp.StatusCode)
				}
			}
		})
	}
}

// TestRetriesCountedOnce: a prefill retry after a connect failure counts
// like the plain forward's: one more attempt in the record, the endpoint in
// ConnectErr, one connect failure for the proxy observer.
func TestRetriesCountedOnce(t *testing.T) {
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){prefillOK("p0", 0), decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(), rigOptions{})
	r.eps[0].kill()
	// Two requests so Tier 2 round-robin tries EP0 once.
	for i := 0; i < 2; i++ {
		if a := r.post(`{"model":"m","prompt":"x"}`); a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	r.atRest()
	waitUntil(t, func() bool { return len(r.pobs.all()) == 2 })
	retried := 0
	for _, rec := range r.pobs.all() {
		switch {
		case rec.Attempts == 2 && len(rec.ConnectErr) == 1 && rec.ConnectErr[0] == 0:
			retried++
		case rec.Attempts == 1 && len(rec.ConnectErr) == 0:
		case rec.Attempts == 2 && len(rec.ConnectErr) == 0:
			// The first request's connect failure can open EP0's breaker
			// before the second picks it: a refusal spends a try too
			// (docs/dataplane.md, the attempt policy), with no connect.
		default:
			t.Fatalf("record: attempts %d, connect errors %v", rec.Attempts, rec.ConnectErr)
		}
		if rec.OutcomeLabel() != "ok" || rec.Decision.Endpoint != 2 {
			t.Fatalf("record: outcome %q on ep %d, want ok on 2", rec.OutcomeLabel(), rec.Decision.Endpoint)
		}
	}
	r.pobs.mu.Lock()
	fails := append([]int(nil), r.pobs.connFail...)
	r.pobs.mu.Unlock()
	// Round-robin may try EP0 for either request or both: each retry is one
	// connect failure, on EP0.
	if retried == 0 || len(fails) != retried || slices.ContainsFunc(fails, func(ep int) bool { return ep != 0 }) {
		t.Fatalf("%d retried records, connect failures %v; want one failure on ep 0 per retry", retried, fails)
	}
}

// TestPlainPathFeedsTheBreaker: requests the two-leg flow hands to the
// plain forward drive the same breaker as the legs: 5xx answers from the
// prefill endpoint open it.
func TestPlainPathFeedsTheBreaker(t *testing.T) {
	fail500 := func(w http.ResponseWriter, _ *http.Request, _ seen) { http.Error(w, `{"error":"boom"}`, 500) }
	r := newRig(t, []func(http.ResponseWriter, *http.Request, seen){fail500, decodeOK("d1"), prefillOK("p2", 0)}, prefillRoles(),
		rigOptions{plainBreaker: true})
	for i := 0; i < health.DefaultOriginErrThreshold; i++ {
		if a := r.post(`{"model":"m","prompt":"x","n":2}`); a.status != 500 {
			t.Fatalf("plain request %d: %d %s", i, a.status, a.body)
		}
	}
	// The answer reaches the client before the forward reports it.
	waitUntil(t, func() bool { return r.tracker.States().BreakerOpen.Has(0) })
	// The two-leg flow now skips EP0.
	if a := r.post(`{"model":"m","prompt":"x"}`); a.status != 200 || len(r.eps[0].seen()) != health.DefaultOriginErrThreshold {
		t.Fatalf("P/D request after the breaker opened: %d; EP0 saw %d requests", a.status, len(r.eps[0].seen()))
	}
	r.atRest()
}
