package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
)

const (
	// bulkBodyBytes is the size of the large streamed body: over 100 MB and
	// not a multiple of any buffer size.
	bulkBodyBytes = 100<<20 + 12_345
	// sseEventCount is the number of small events in the SSE stream.
	sseEventCount = 10_000
	// handOverPause is how long the backend waits between its response head
	// and the first body byte, as an engine's first token does. The sockmap
	// leg drains the backend socket before it takes it into the map, and a
	// body that outruns or completes within that drain is (correctly)
	// copied in userspace; the pause makes the kernel move the whole body
	// so the test can count it.
	handOverPause = 200 * time.Millisecond
)

// sentBody is what the backend wrote for one response body.
type sentBody struct {
	n   int64
	sum [32]byte
	err error
}

// bigBackend is a plain net/http backend streaming a large chunked
// octet-stream (/bulk) and an SSE stream of many small events (/sse), both
// deterministic, reporting the length and SHA-256 of each body it sent.
type bigBackend struct {
	addr string
	sent chan sentBody
}

func startBigBackend(t *testing.T, host string) *bigBackend {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	b := &bigBackend{addr: ln.Addr().String(), sent: make(chan sentBody, 4)}
	mux := http.NewServeMux()
	mux.HandleFunc("/bulk", b.serveBulk)
	mux.HandleFunc("/sse", b.serveSSE)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return b
}

// startBody sends the response head, then pauses (handOverPause).
func startBody(w http.ResponseWriter, contentType string) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	time.Sleep(handOverPause)
}

// serveBulk streams bulkBodyBytes of ChaCha8 output, chunked, in writes of
// pseudo-random sizes (1 byte to 256 KiB) so chunk boundaries fall anywhere.
func (b *bigBackend) serveBulk(w http.ResponseWriter, _ *http.Request) {
	startBody(w, "application/octet-stream")
	src := rand.NewChaCha8([32]byte{'k', 'v', 'g', 'a', 't', 'e'})
	sizes := rand.New(rand.NewPCG(10, 100))
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var n int64
	for n < bulkBodyBytes {
		m := min(int(bulkBodyBytes-n), 1+sizes.IntN(len(buf)))
		_, _ = src.Read(buf[:m])
		h.Write(buf[:m])
		if _, err := w.Write(buf[:m]); err != nil {
			b.sent <- sentBody{n: n, err: fmt.Errorf("bulk write at %d: %w", n, err)}
			return
		}
		n += int64(m)
	}
	b.sent <- sentBody{n: n, sum: [32]byte(h.Sum(nil))}
}

// serveSSE streams sseEventCount events `data: {"i":N,"text":"…"}` of
// 1–40 pseudo-random hex bytes, each flushed as its own chunk, with a
// 1 ms pause every 250 events (a token stream, only faster).
func (b *bigBackend) serveSSE(w http.ResponseWriter, _ *http.Request) {
	startBody(w, "text/event-stream")
	rc := http.NewResponseController(w)
	rng := rand.New(rand.NewPCG(7, 77))
	h := sha256.New()
	var n int64
	raw := make([]byte, 20)
	for i := range sseEventCount {
		raw = raw[:1+rng.IntN(20)]
		for j := range raw {
			raw[j] = byte(rng.Uint32())
		}
		ev := fmt.Sprintf("data: {\"i\":%d,\"text\":%q}\n\n", i, hex.EncodeToString(raw))
		h.Write([]byte(ev))
		if _, err := io.WriteString(w, ev); err != nil {
			b.sent <- sentBody{n: n, err: fmt.Errorf("event %d: %w", i, err)}
			return
		}
		if err := rc.Flush(); err != nil {
			b.sent <- sentBody{n: n, err: fmt.Errorf("flushing event %d: %w", i, err)}
			return
		}
		n += int64(len(ev))
		if i%250 == 249 {
			time.Sleep(time.Millisecond)
		}
	}
	b.sent <- sentBody{n: n, sum: [32]byte(h.Sum(nil))}
}

// plainRuleJSON renders a rule without a KV tier (kvExactMode 0) on
// vip:port over one endpoint, with a TCP health probe (the default there).
func plainRuleJSON(t *testing.T, vip string, port int, endpoint string) []byte {
	t.Helper()
	host, p, err := net.SplitHostPort(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	targetPort, _ := strconv.Atoi(p)
	b, err := json.Marshal(map[string]any{
		"serviceArguments": map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4, "kvExactMode": 0},
		"endpoints":        []map[string]any{{"endpointIP": host, "targetPort": targetPort, "weight": 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// dialCounted is dialRaw whose reader counts wire bytes, so a test can tell
// how many bytes a response body took on the wire (chunk framing included).
func dialCounted(t *testing.T, base string) (*rawClient, func() int64) {
	t.Helper()
	rc := dialRaw(t, base)
	cr := &countingReader{r: rc.conn}
	rc.br = bufio.NewReader(cr)
	return rc, func() int64 { return cr.n - int64(rc.br.Buffered()) }
}

// fetched is one response read through kvgate.
type fetched struct {
	resp      *http.Response
	decoded   int64    // body bytes after chunk decoding
	sum       [32]byte // SHA-256 of the decoded body
	wire      int64    // body bytes on the wire (chunk framing included)
	body      []byte   // the decoded body, when kept
	keepAlive bool
}

// fetchBody POSTs to path on rc, reads the whole response and checks that
// it is a 200 with chunked framing on a connection kept alive.
func fetchBody(t *testing.T, rc *rawClient, pos func() int64, path string, keep bool) fetched {
	t.Helper()
	resp := rc.start(t, path, map[string]any{"model": "plain", "prompt": path})
	start := pos()
	h := sha256.New()
	var kept bytes.Buffer
	w := io.Writer(h)
	if keep {
		w = io.MultiWriter(h, &kept)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the body after %d bytes: %v", path, n, err)
	}
	f := fetched{resp: resp, decoded: n, sum: [32]byte(h.Sum(nil)), wire: pos() - start, body: kept.Bytes(), keepAlive: !resp.Close}
	if resp.StatusCode != http.StatusOK || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("%s: status %d, transfer encoding %v (want 200, chunked)", path, resp.StatusCode, resp.TransferEncoding)
	}
	if !f.keepAlive {
		t.Fatalf("%s: kvgate closes the client connection after the response", path)
	}
	return f
}

// checkSSEEvents checks that an SSE body holds events 0..sseEventCount-1 in order.
func checkSSEEvents(t *testing.T, body []byte) {
	t.Helper()
	events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	if len(events) != sseEventCount {
		t.Fatalf("SSE stream: %d events, want %d", len(events), sseEventCount)
	}
	for i, ev := range events {
		var e struct {
			I int `json:"i"`
		}
		d, ok := strings.CutPrefix(ev, "data: ")
		if !ok || json.Unmarshal([]byte(d), &e) != nil || e.I != i {
			t.Fatalf("SSE event %d is %q", i, ev)
		}
	}
}

// TestDatapathLargeBodiesBothPaths proves large bodies survive both body legs (docs/body-leg.md)
// through the real daemon proxy (pkg/gateway, pkg/fullproxy): behind a
// kvExactMode-0 rule created through the API, a plain net/http backend
// streams a chunked 100 MiB octet-stream and an SSE stream of 10,000 small
// events, each flushed as its own chunk. On both data paths, on one client
// keep-alive connection, each body arrives byte-identical (SHA-256 of the
// chunk-decoded body against the backend's) and the connection stays open.
// On the sockmap path the kernel moved the bodies: the BPF counter
// (kvgate_spliced_bytes_total{path="sockmap"}) grows by at least the 100 MiB
// body, and it plus the userspace counter (the bytes kvgate wrote itself)
// add up to exactly the body bytes on the wire, so no byte is counted twice
// or lost; on the userspace path the BPF counter does not move and the
// userspace counter takes the whole body. In-flight counts (and, with BPF,
// the load map) return to 0.
func TestDatapathLargeBodiesBothPaths(t *testing.T) {
	for _, mode := range []string{"sockmap", "userspace"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "sockmap" && os.Getenv("KVGATE_REQUIRE_BPF") != "1" && os.Geteuid() != 0 {
				t.Skip("needs root for the sockmap path (KVGATE_REQUIRE_BPF=1 makes this a failure)")
			}
			block := testnet.Block(t)
			backend := startBigBackend(t, block+"11")
			tg := startDatapathOnly(t, block, mode)
			if got := tg.metric(t, "kvgate_datapath_info", map[string]string{"path": mode}); got != 1 {
				t.Fatalf("kvgate_datapath_info{path=%q} = %v, want 1", mode, got)
			}
			vip := block + "1"
			port := testnet.Port(t, vip)
			id := tg.createRule(t, plainRuleJSON(t, vip, port, backend.addr))
			rc, pos := dialCounted(t, fmt.Sprintf("http://%s:%d", vip, port))

			moved := func() (sockmap, userspace float64) {
				return tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "sockmap"}),
					tg.metric(t, "kvgate_spliced_bytes_total", map[string]string{"path": "userspace"})
			}
			for i, tc := range []struct {
				path, contentType string
				minSpliced        int64 // on the sockmap path
			}{
				{"/bulk", "application/octet-stream", bulkBodyBytes},
				{"/sse", "text/event-stream", 1},
			} {
				k0, u0 := moved()
				got := fetchBody(t, rc, pos, tc.path, tc.path == "/sse")
				var sent sentBody
				select {
				case sent = <-backend.sent:
				case <-time.After(5 * time.Second):
					t.Fatalf("%s: the backend did not finish", tc.path)
				}
				if sent.err != nil {
					t.Fatalf("%s: backend: %v", tc.path, sent.err)
				}
				if ct := got.resp.Header.Get("Content-Type"); ct != tc.contentType {
					t.Fatalf("%s: Content-Type %q, want %q", tc.path, ct, tc.contentType)
				}
				if got.decoded != sent.n || got.sum != sent.sum {
					t.Fatalf("%s: received %d bytes, sha256 %x; the backend sent %d bytes, sha256 %x",
						tc.path, got.decoded, got.sum, sent.n, sent.sum)
				}
				if tc.path == "/sse" {
					checkSSEEvents(t, got.body)
				}

				// The legs count when they return, which can be just after
				// the client has the last byte.
				var dk, du float64
				waitFor(t, tc.path+" byte counters", 3*time.Second, func() bool {
					k, u := moved()
					dk, du = k-k0, u-u0
					return dk+du >= float64(got.wire)
				})
				rec := tg.accessRecord(t, i+1)
				if rec["outcome"] != "ok" || rec["datapath"] != mode {
					t.Fatalf("%s: access record %v (want outcome ok, datapath %s)", tc.path, rec, mode)
				}
				switch mode {
				case "sockmap":
					if dk < float64(tc.minSpliced) {
						t.Fatalf("%s: kvgate_spliced_bytes_total{path=\"sockmap\"} grew by %.0f, want ≥ %d (userspace copied %.0f of %d wire bytes)",
							tc.path, dk, tc.minSpliced, du, got.wire)
					}
					if dk+du != float64(got.wire) {
						t.Fatalf("%s: sockmap %.0f + userspace %.0f bytes ≠ %d body bytes on the wire", tc.path, dk, du, got.wire)
					}
				case "userspace":
					if dk != 0 || du != float64(got.wire) {
						t.Fatalf("%s: sockmap counter grew by %.0f and userspace by %.0f; want 0 and the %d wire bytes", tc.path, dk, du, got.wire)
					}
				}
				t.Logf("%s: %d body bytes (%d on the wire), sockmap %.0f, userspace %.0f", tc.path, got.decoded, got.wire, dk, du)
			}

			if mode == "sockmap" {
				assertBPFLoadsZero(t, tg, id, 1)
			} else {
				assertLoadsZero(t, tg, id)
			}
		})
	}
}
