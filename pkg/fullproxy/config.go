package fullproxy

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/datapath"
)

// Limits bound every size and every wait of the proxy. Zero fields take the
// defaults of DefaultLimits.
type Limits struct {
	MaxHeaderBytes int   // request head, else 431 (64 KiB)
	MaxBodyBytes   int64 // request body, else 413 (64 MiB)
	InspectBytes   int64 // bodies above this are forwarded uninspected (16 MiB)

	IdleTimeout   time.Duration // keep-alive wait for the next request (120 s)
	HeaderTimeout time.Duration // reading one request head (10 s)
	BodyTimeout   time.Duration // reading one request body (120 s)

	ConnectTimeout        time.Duration // backend dial (3 s)
	MaxAttempts           int           // routing attempts per request, connect failures included (3)
	ResponseHeaderTimeout time.Duration // backend time to first response byte (600 s: a long prompt)
	StreamSilence         time.Duration // body leg ends after this long without a byte (300 s)
	WriteTimeout          time.Duration // writing a request to the backend or a head to the client (60 s)

	MaxConns int // concurrent client connections; beyond it new ones are closed (10000)
}

// DefaultLimits are the limits used for zero fields.
var DefaultLimits = Limits{
	MaxHeaderBytes:        64 << 10,
	MaxBodyBytes:          64 << 20,
	InspectBytes:          16 << 20,
	IdleTimeout:           120 * time.Second,
	HeaderTimeout:         10 * time.Second,
	BodyTimeout:           120 * time.Second,
	ConnectTimeout:        3 * time.Second,
	MaxAttempts:           3,
	ResponseHeaderTimeout: 600 * time.Second,
	StreamSilence:         300 * time.Second,
	WriteTimeout:          60 * time.Second,
	MaxConns:              10000,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxHeaderBytes > 0 {
		d.MaxHeaderBytes = l.MaxHeaderBytes
	}
	if l.MaxBodyBytes > 0 {
		d.MaxBodyBytes = l.MaxBodyBytes
	}
	if l.InspectBytes > 0 {
		d.InspectBytes = l.InspectBytes
	}
	if d.InspectBytes > d.MaxBodyBytes {
		d.InspectBytes = d.MaxBodyBytes
	}
	for _, p := range []struct{ dst, src *time.Duration }{
		{&d.IdleTimeout, &l.IdleTimeout}, {&d.HeaderTimeout, &l.HeaderTimeout}, {&d.BodyTimeout, &l.BodyTimeout},
		{&d.ConnectTimeout, &l.ConnectTimeout}, {&d.ResponseHeaderTimeout, &l.ResponseHeaderTimeout},
		{&d.StreamSilence, &l.StreamSilence}, {&d.WriteTimeout, &l.WriteTimeout},
	} {
		if *p.src > 0 {
			*p.dst = *p.src
		}
	}
	if l.MaxAttempts > 0 {
		d.MaxAttempts = l.MaxAttempts
	}
	if l.MaxConns > 0 {
		d.MaxConns = l.MaxConns
	}
	return d
}

// Observer receives what the proxy measures. The daemon implements it on top
// of pkg/metrics; every method must be cheap and safe for concurrent use.
type Observer interface {
	// ConnectFailed: a backend dial to ep failed and the request was re-routed
	// (feeds loxilb_pd_connect_failover_total).
	ConnectFailed(service string, ep int)
	// TTFB: the backend's time to first response byte (loxilb_proxy_http_ttfb_seconds).
	TTFB(service string, ep int, d time.Duration)
	// Inflight: ep's in-flight count changed to n (kvgate_endpoint_inflight).
	Inflight(service string, ep, n int)
	// Done: one request finished (request count and duration per endpoint and
	// outcome; decision stage latencies).
	Done(r *Record)
}

// NopObserver discards everything.
type NopObserver struct{}

func (NopObserver) ConnectFailed(string, int)       {}
func (NopObserver) TTFB(string, int, time.Duration) {}
func (NopObserver) Done(*Record)                    {}
func (NopObserver) Inflight(string, int, int)       {}

// Config configures one rule's proxy.
type Config struct {
	// Service names the rule in logs and metrics (its service_id).
	Service string
	// Addr is the listen address, externalIP:port. IP_FREEBIND lets it bind
	// before the VIP is configured on the host.
	Addr string
	// Handler serves every request read from a client: the plain forward
	// (NewForward) or a handler built on the same Exchange calls.
	// Required.
	Handler Handler
	// Leg moves response bodies; nil means the userspace copy.
	Leg datapath.BodyLeg
	// Loads is the in-flight count per endpoint; nil makes a private one.
	Loads    *Loads
	Observer Observer
	Limits   Limits
	// DecisionHeader adds x-kvgate-decision to every proxied response.
	DecisionHeader bool
	// AccessLog, when set, gets one line per request.
	AccessLog *slog.Logger
	Logger    *slog.Logger
	// Dial overrides the backend dialer: tests, and the TLS dialer of a
	// security-2 rule (pkg/gateway, tls.go); nil uses net.Dialer.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// DialControl, when set, is the default dialer's net.Dialer.Control: it
	// runs on each backend socket before connect(). The daemon uses it to tag
	// backend sockets for the BPF load map (splice.Datapath.TagBackend).
	DialControl func(network, address string, c syscall.RawConn) error
	// BodyAuditor, when set, may tap relayed response bodies (the
	// per-request usage audit, docs/parity.md); nil taps none.
	BodyAuditor BodyAuditor
	// Guard recovers a panic in one connection's handling (the connection
	// closes, the proxy keeps serving); nil still recovers, uncounted.
	Guard *recovery.Guard
	// TLS, when set, terminates TLS on every accepted connection before the
	// HTTP/1.1 server reads it (package tlsterm; docs/security.md).
	TLS TLSTerminator
	// Pool, when set, keeps idle backend connections for the plain
	// forward's next requests, within these bounds (pool.go). The daemon
	// sets it on security-2 rules, whose connections cost a TLS handshake;
	// nil opens one connection per request with "Connection: close".
	Pool *PoolOptions
}

// TLSTerminator wraps accepted connections in TLS. Wrap does no I/O (it runs
// in the accept loop); Handshake runs on the connection's own goroutine,
// bounded by the terminator's handshake timeout, and counts its failures.
type TLSTerminator interface {
	Wrap(nc net.Conn) *tls.Conn
	Handshake(ctx context.Context, tc *tls.Conn) error
}
