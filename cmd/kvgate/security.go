package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/pkg/apiauth"
	"github.com/kvgate/kvgate/pkg/metrics"
)

// apiSecurity is the management API's guard and TLS, built from the flags.
type apiSecurity struct {
	guard    *apiauth.Guard
	tls      *apiauth.TLS // nil: plain HTTP
	insecure bool         // beyond loopback without TLS or tokens, by --api-insecure
	obs      *authMetrics
}

// openAPISecurity applies the safe defaults: an API beyond loopback needs
// both TLS and a token file, unless --api-insecure says otherwise.
func openAPISecurity(f daemonFlags, log *slog.Logger) (*apiSecurity, error) {
	if (f.apiTLSCert == "") != (f.apiTLSKey == "") {
		return nil, errors.New("--api-tls-cert and --api-tls-key go together")
	}
	if f.apiClientCA != "" && f.apiTLSCert == "" {
		return nil, errors.New("--api-client-ca needs --api-tls-cert and --api-tls-key")
	}
	sec := &apiSecurity{obs: &authMetrics{}}
	loopback, err := loopbackOnly(f.api)
	if err != nil {
		return nil, err
	}
	if !loopback && (f.apiTLSCert == "" || f.apiTokenFile == "") {
		if !f.apiInsecure {
			return nil, fmt.Errorf("--api %s is reachable beyond loopback: give --api-tls-cert, --api-tls-key and --api-token-file, or --api-insecure to run it unprotected (docs/security.md)", f.api)
		}
		sec.insecure = true
		log.Warn("the management API is reachable beyond loopback without TLS and tokens (--api-insecure): anyone who reaches it can rewrite routing", "api", f.api)
	}
	sec.guard, err = apiauth.NewGuard(apiauth.GuardOptions{TokenFile: f.apiTokenFile, Open: []string{"/healthz", "/readyz"},
		Observer: sec.obs, Log: log})
	if err != nil {
		return nil, fmt.Errorf("--api-token-file: %w", err)
	}
	if f.apiTLSCert != "" {
		sec.tls, err = apiauth.NewTLS(apiauth.TLSOptions{CertFile: f.apiTLSCert, KeyFile: f.apiTLSKey, ClientCAFile: f.apiClientCA,
			Observer: sec.obs, Log: log})
		if err != nil {
			return nil, fmt.Errorf("--api-tls-cert/--api-tls-key/--api-client-ca: %w", err)
		}
	}
	return sec, nil
}

// loopbackOnly says whether an --api address is reachable from this host only.
func loopbackOnly(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("--api %q: %w", addr, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false, nil // a name: it may resolve anywhere
	}
	return ip.IsLoopback(), nil
}

// listen wraps the API listener in TLS when configured.
func (s *apiSecurity) listen(ln net.Listener) net.Listener {
	if s.tls == nil {
		return ln
	}
	return tls.NewListener(ln, s.tls.Config())
}

// run follows the token file and certificates until ctx ends.
func (s *apiSecurity) run(ctx context.Context) {
	go s.guard.Run(ctx)
	if s.tls != nil {
		go s.tls.Run(ctx)
	}
}

// bind points the guard's counters at the gateway's metrics.
func (s *apiSecurity) bind(m *metrics.Metrics) {
	s.obs.m.Store(m)
	if s.insecure {
		m.APIInsecure.Set(1)
	}
}

type authMetrics struct {
	m atomic.Pointer[metrics.Metrics]
}

func (a *authMetrics) AuthFailure(reason string) {
	if m := a.m.Load(); m != nil {
		m.APIAuthFailures.WithLabelValues(reason).Inc()
	}
}

func (a *authMetrics) Reload(what string, ok bool) {
	if m := a.m.Load(); m != nil {
		result := "ok"
		if !ok {
			result = "error"
		}
		m.APIReloads.WithLabelValues(what, result).Inc()
	}
}

// serveMetrics serves only /metrics, unauthenticated, on its own listener
// (--metrics-addr), so Prometheus needs no API token. It stops with ctx.
func serveMetrics(ctx context.Context, addr string, m *metrics.Metrics, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 16 << 10}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), nil
}
