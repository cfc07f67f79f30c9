package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/datapath"
)

// startDatapathGateway starts engines, a gateway on the given --datapath and
// a kvExactMode-3 rule over the engines (as startMode3). A sockmap gateway
// that cannot load BPF skips the test, or fails it under KVGATE_REQUIRE_BPF=1
// (CI runs as root on a BPF-capable kernel).
func startDatapathGateway(t *testing.T, mode string, specs []engineSpec) ([]*enginesim.Engine, *testGateway, int, string) {
	t.Helper()
	block := testnet.Block(t)
	engines, zmq := startEngines(t, block, specs)
	tg := startDatapathOnly(t, block, mode)
	args := map[string]any{"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}
	id, base := createKVRule(t, tg, block+"1", engines, nil, args)
	tg.waitSubscribed(t, id, len(engines))
	return engines, tg, id, base
}

// startDatapathOnly starts a gateway on the given --datapath with its API
// on <block>.2 and no rules. A sockmap gateway that cannot load BPF skips
// the test, or fails it under KVGATE_REQUIRE_BPF=1.
func startDatapathOnly(t *testing.T, block, mode string) *testGateway {
	t.Helper()
	tg, err := tryStartGateway(t, block, "2", mode, nil)
	if err != nil {
		if errors.Is(err, datapath.ErrKernelUnavailable) && os.Getenv("KVGATE_REQUIRE_BPF") != "1" {
			t.Skipf("sockmap data path unavailable here (KVGATE_REQUIRE_BPF=1 makes this a failure): %v", err)
		}
		t.Fatalf("gateway with --datapath=%s: %v", mode, err)
	}
	return tg
}

// rawClient is one client keep-alive connection, so a test controls which
// requests share it.
type rawClient struct {
	conn net.Conn
	br   *bufio.Reader
	host string
}

func dialRaw(t *testing.T, base string) *rawClient {
	t.Helper()
	host := strings.TrimPrefix(base, "http://")
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{conn: c, br: bufio.NewReader(c), host: host}
}

// do sends one POST on the connection and reads the whole response, within 20 s.
func (rc *rawClient) do(t *testing.T, path string, body any) (*http.Response, []byte) {
	t.Helper()
	resp := rc.start(t, path, body)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp, b
}

// start sends one POST and reads the response head.
func (rc *rawClient) start(t *testing.T, path string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	_ = rc.conn.SetDeadline(time.Now().Add(20 * time.Second))
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, rc.host, len(b))
	if _, err := rc.conn.Write(append([]byte(req), b...)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatalf("reading the response head: %v", err)
	}
	return resp
}

// volatileFields are the parts of an enginesim response that differ between
// two runs of the same request: the random response id and the creation time.
var volatileFields = regexp.MustCompile(`"id":"[^"]*"|"created":[0-9]+`)

// sseEvents parses an SSE body into its data payloads, with the volatile
// fields blanked, and checks it ends with [DONE].
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, volatileFields.ReplaceAllLiteralString(d, `"volatile"`))
		}
	}
	if len(out) < 3 || out[len(out)-1] != "[DONE]" {
		t.Fatalf("not a complete SSE stream (%d events): %q", len(out), body)
	}
	return out
}

func (tg *testGateway) accessRecord(t *testing.T, n int) map[string]any {
	t.Helper()
	var recs []map[string]any
	waitFor(t, fmt.Sprintf("%d access records", n), 3*time.Second, func() bool {
		recs = accessRecords(tg.access)
		return len(recs) >= n
	})
	return recs[n-1]
}

// assertBPFLoadsZero checks that the BPF load map agrees with the proxy's
// in-flight counts at rest: 0 for every endpoint.
func assertBPFLoadsZero(t *testing.T, tg *testGateway, id, endpoints int) {
	t.Helper()
	assertLoadsZero(t, tg, id)
	for ep := range endpoints {
		var n uint64
		var err error
		waitFor(t, fmt.Sprintf("BPF load map at 0 for ep %d", ep), 3*time.Second, func() bool {
			n, err = tg.g.BPFActiveConns(id, ep)
			return err == nil && n == 0
		})
	}
}

// TestDatapathStreamBothPaths runs the real proxy (fullproxy) with the
// sockmap body leg and with the userspace copy against enginesim: the same
// streamed chat completion arrives identical on both; on the sockmap path
// the kernel moved it (kvgate_spliced_bytes_total{path="sockmap"} grows, the
// access log says sockmap) and, while a stream is in flight, the BPF load map
// counts its backend connection as the proxy does; a second request on the
// same client connection is routed afresh; at rest both counts are 0.
func TestDatapathStreamBothPaths(t *testing.T) {
	chat := func(user string, n int) map[string]any {
		return map[string]any{"model": model, "stream": true, "max_tokens": n,
			"messages": []map[string]any{{"role": "system", "content": preamble}, {"role": "user", "content": user}}}
	}
	streams := map[string][]string{}
	for _, mode := range []string{"sockmap", "userspace"} {
		t.Run(mode, func(t *testing.T) {
			engines, tg, id, base := startDatapathGateway(t, mode, []engineSpec{{}, {}})
			if got := tg.metric(t, "kvgate_datapath_info", map[string]string{"path": mode}); got != 1 {
				t.Fatalf("kvgate_datapath_info{path=%q} = %v, want 1", mode, got)
			}
			splicedBefore := tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"})
			rc := dialRaw(t, base)

			// 1. A streamed chat completion.
			resp, body := rc.do(t, "/v1/chat/completions", chat("How do I drain a worker?", 120))
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("stream: %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			streams[mode] = sseEvents(t, body)
			rec := tg.accessRecord(t, 1)
			if rec["datapath"] != mode || rec["outcome"] != "ok" {
				t.Fatalf("access record of the stream: %v (want datapath %s, outcome ok)", rec, mode)
			}
			spliced := tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"}) - splicedBefore
			if mode == "sockmap" && spliced <= 0 {
				t.Fatalf("kvgate_spliced_bytes_total{path=\"sockmap\"} did not grow after a spliced stream")
			}
			if mode == "userspace" && spliced != 0 {
				t.Fatalf("userspace path spliced %v bytes in the kernel", spliced)
			}

			// 2. The next request on the same client connection is decided
			// afresh: it gets its own decision, and the engine that answers
			// is the one decided.
			resp2, body2 := rc.do(t, "/v1/chat/completions", chat("And how do I add one back?", 40))
			if resp2.StatusCode != 200 {
				t.Fatalf("second request on the keep-alive connection: %d %s", resp2.StatusCode, body2)
			}
			sseEvents(t, body2)
			for i, r := range []*http.Response{resp, resp2} {
				dec := r.Header.Get("x-kvgate-decision")
				ep, err := strconv.Atoi(decisionField(dec, "ep"))
				if err != nil || ep < 0 || ep >= len(engines) {
					t.Fatalf("request %d: decision %q names no endpoint", i+1, dec)
				}
				if want := fmt.Sprintf("engine-%d", ep); r.Header.Get("x-engine-id") != want {
					t.Fatalf("request %d: decided ep %d but served by %q", i+1, ep, r.Header.Get("x-engine-id"))
				}
			}
			if rec := tg.accessRecord(t, 2); rec["outcome"] != "ok" || rec["datapath"] != mode {
				t.Fatalf("access record of the second request: %v", rec)
			}

			// 3. Two requests pipelined in one write: the second is already in
			// the proxy's client reader (or the client socket) while the first
			// streams, and must stay there, not be lost to the body leg.
			var pipelined bytes.Buffer
			for _, user := range []string{"First of two.", "Second of two."} {
				b, _ := json.Marshal(chat(user, 60))
				fmt.Fprintf(&pipelined, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", rc.host, len(b), b)
			}
			_ = rc.conn.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := rc.conn.Write(pipelined.Bytes()); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				r, err := http.ReadResponse(rc.br, nil)
				if err != nil {
					t.Fatalf("pipelined response %d: %v", i+1, err)
				}
				b, err := io.ReadAll(r.Body)
				if err != nil || r.StatusCode != 200 {
					t.Fatalf("pipelined response %d: %d %v %s", i+1, r.StatusCode, err, b)
				}
				sseEvents(t, b)
			}

			// 4. While a stream is in flight, the BPF map counts its backend
			// connection like the proxy does (sockmap only).
			if mode == "sockmap" {
				rc3 := dialRaw(t, base)
				resp3 := rc3.start(t, "/v1/chat/completions", chat("Count to fifty, slowly.", 2000))
				ep, _ := strconv.Atoi(decisionField(resp3.Header.Get("x-kvgate-decision"), "ep"))
				loads, _ := tg.g.Loads(id)
				if inflight := loads.Load(ep); inflight != 1 {
					t.Fatalf("proxy in-flight count for ep %d mid-stream = %d, want 1", ep, inflight)
				}
				// (A health probe may hold a connection of its own for a moment.)
				var seen []uint64
				for deadline := time.Now().Add(800 * time.Millisecond); ; time.Sleep(20 * time.Millisecond) {
					n, err := tg.g.BPFActiveConns(id, ep)
					if err != nil {
						t.Fatal(err)
					}
					seen = append(seen, n)
					if n == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("BPF load map for ep %d mid-stream: %v, want 1 as the proxy counts", ep, seen)
					}
				}
				if _, err := io.Copy(io.Discard, resp3.Body); err != nil {
					t.Fatal(err)
				}
				assertBPFLoadsZero(t, tg, id, len(engines))
			} else {
				if _, err := tg.g.BPFActiveConns(id, 0); err == nil {
					t.Fatal("the userspace path reports a BPF load map")
				}
				assertLoadsZero(t, tg, id)
			}
		})
	}
	if len(streams) == 2 && !equalStrings(streams["sockmap"], streams["userspace"]) {
		t.Fatalf("the stream differs between paths:\nsockmap:   %q\nuserspace: %q", streams["sockmap"], streams["userspace"])
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDatapathAutoBulkStaysInUserspace: under --datapath=auto a large
// non-streamed response (above the 64 KiB threshold --datapath=sockmap would
// splice) is copied in userspace, where bulk moves faster; a stream on the
// same gateway is spliced.
func TestDatapathAutoBulkStaysInUserspace(t *testing.T) {
	if os.Getenv("KVGATE_REQUIRE_BPF") != "1" && os.Geteuid() != 0 {
		t.Skip("needs root for the sockmap path (KVGATE_REQUIRE_BPF=1 makes this a failure)")
	}
	_, tg, id, base := startDatapathGateway(t, "auto", []engineSpec{{decodeTS: 20_000}})
	if got := tg.metric(t, "kvgate_datapath_info", map[string]string{"path": "sockmap"}); got != 1 {
		if os.Getenv("KVGATE_REQUIRE_BPF") == "1" {
			t.Fatal("--datapath=auto did not pick sockmap on a BPF-capable machine")
		}
		t.Skip("auto fell back to userspace here")
	}
	rc := dialRaw(t, base)
	before := tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"})
	resp, body := rc.do(t, "/v1/completions", map[string]any{"model": model, "prompt": "Write a long report.", "max_tokens": 16000})
	if resp.StatusCode != 200 || len(body) < 64<<10 {
		t.Fatalf("bulk response: %d, %d bytes (want 200 and ≥ 64 KiB)", resp.StatusCode, len(body))
	}
	if !json.Valid(body) {
		t.Fatalf("bulk response: %d bytes of invalid JSON", len(body))
	}
	if rec := tg.accessRecord(t, 1); rec["datapath"] != "userspace" || rec["outcome"] != "ok" {
		t.Fatalf("bulk response under auto: access record %v (want datapath userspace)", rec)
	}
	if after := tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"}); after != before {
		t.Fatalf("bulk response under auto spliced %v bytes in the kernel", after-before)
	}

	// A stream on the same connection is spliced (50 ms of tokens: a stream
	// that ends before the hand-over finishes in userspace, correctly).
	resp2, body2 := rc.do(t, "/v1/completions", map[string]any{"model": model, "prompt": "Now briefly.", "max_tokens": 1000, "stream": true})
	if resp2.StatusCode != 200 || !bytes.Contains(body2, []byte("[DONE]")) {
		t.Fatalf("stream after the bulk response: %d %s", resp2.StatusCode, body2)
	}
	if rec := tg.accessRecord(t, 2); rec["datapath"] != "sockmap" || rec["outcome"] != "ok" {
		t.Fatalf("stream under auto: access record %v (want datapath sockmap)", rec)
	}
	if after := tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"}); after <= before {
		t.Fatal("a stream under auto was not spliced")
	}
	assertBPFLoadsZero(t, tg, id, 1)
}
