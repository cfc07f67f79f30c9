package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// oneEndpoint routes every request to addr.
type oneEndpoint struct{ addr string }

func (r oneEndpoint) Plan(context.Context, *fullproxy.Request) fullproxy.RoutePlan { return r }
func (r oneEndpoint) Route(context.Context, epset.Set) (fullproxy.Decision, error) {
	return fullproxy.Decision{Endpoint: 0, Addr: r.addr, Tier: "2", Reason: "bench"}, nil
}
func (oneEndpoint) Finish(fullproxy.Decision, bool) {}

// startKeepAliveEngine is a real HTTP/1.1 server (net/http, keep-alive on)
// answering a small JSON body, over TLS when pair is set.
func startKeepAliveEngine(tb testing.TB, pair *testcerts.Pair) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Second, // uvicorn's keep-alive
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"text":"ok"}]}`)
		})}
	if pair != nil {
		cert, err := pair.TLS()
		if err != nil {
			tb.Fatal(err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
		go func() { _ = srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { _ = srv.Serve(ln) }()
	}
	tb.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// BenchmarkBackendTLSPool: one request through the proxy to a TLS engine,
// per engine-connection policy: a pooled connection (security 2 today), a
// new connection per request with the session resumed (security 2 before
// the pool), a new connection with a full handshake each time, and, for
// reference, plain TCP per request. The client keeps one keep-alive
// connection to the proxy, so only the engine side differs. "seq" is one
// request at a time (ns/op is the per-request latency); "par4" runs four
// clients (req/s is the proxy's throughput).
func BenchmarkBackendTLSPool(b *testing.B) {
	dir := b.TempDir()
	ca, pair, caFile := engineCerts(b, dir)
	tlsAddr := startKeepAliveEngine(b, pair)
	plainAddr := startKeepAliveEngine(b, nil)
	engineTLS, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		b.Fatal(err)
	}
	resumed := newBackendTLSDialer(engineTLS, nil)
	var d net.Dialer
	full := func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(nc, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		return tc, nil
	}
	cases := []struct {
		name string
		addr string
		dial func(ctx context.Context, addr string) (net.Conn, error)
		pool bool
	}{
		{"tls-pooled", tlsAddr, resumed, true},
		{"tls-resumed-per-request", tlsAddr, resumed, false},
		{"tls-full-handshake-per-request", tlsAddr, full, false},
		{"plain-tcp-per-request", plainAddr, nil, false},
	}
	for _, c := range cases {
		cfg := fullproxy.Config{Addr: "127.0.0.1:0", Handler: fullproxy.NewForward(oneEndpoint{c.addr}, nil), Dial: c.dial}
		if c.pool {
			cfg.Pool = &fullproxy.PoolOptions{}
		}
		srv, err := fullproxy.Listen(cfg)
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve() }()
		b.Cleanup(func() { _ = srv.Close() })
		proxy := srv.Addr().String()
		b.Run(c.name+"/seq", func(b *testing.B) {
			cl := newBenchClient(b, proxy)
			for b.Loop() {
				cl.post(b)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
		b.Run(c.name+"/par4", func(b *testing.B) {
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				cl := newBenchClient(b, proxy)
				for pb.Next() {
					cl.post(b)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

// benchClient sends requests on one keep-alive connection to the proxy.
type benchClient struct {
	c  net.Conn
	br *bufio.Reader
}

const benchBody = `{"model":"m","prompt":"hi","max_tokens":1}`

var benchRequest = fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
	len(benchBody), benchBody)

func newBenchClient(b *testing.B, addr string) *benchClient {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return &benchClient{c: c, br: bufio.NewReader(c)}
}

func (cl *benchClient) post(b *testing.B) {
	_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(cl.c, benchRequest); err != nil {
		b.Error(err)
		return
	}
	resp, err := http.ReadResponse(cl.br, nil)
	if err != nil {
		b.Error(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "text_completion") {
		b.Errorf("status %d body %q", resp.StatusCode, body)
	}
}
