package gateway

// TLS rules (security 1 and 2): the client-side terminator, the TLS dialer
// towards security-2 engines, and the body leg a TLS rule takes
// (docs/security.md, "TLS termination on the data plane"; docs/body-leg.md).

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// Body-leg reasons of kvgate_rule_datapath_info{reason}.
const (
	legReasonDatapath = "datapath" // the daemon's --datapath choice
	legReasonTLS      = "tls"      // TLS bytes: the userspace copy
)

// ruleLeg is the body path a rule's responses take and why. The sockmap
// redirects the bytes a socket receives, and on a TLS rule those are
// ciphertext for the other side's session: only kTLS on both sockets would
// let the kernel move them (the seam is splice.tcpSocket). This kernel
// family offers no kTLS here (no "tls" in tcp_available_ulp), so TLS rules
// take the userspace copy; the sockmap leg itself falls back to it for any
// connection that is not plain TCP.
func ruleLeg(rule *config.Rule, daemonPath string) (path, reason string) {
	if rule.TerminatesTLS() || rule.BackendTLS() {
		return "userspace", legReasonTLS
	}
	return daemonPath, legReasonDatapath
}

// kernelTLSAvailable reports whether the kernel offers the kTLS ULP (read
// once per TLS rule, for the log line that explains the choice).
func kernelTLSAvailable() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_ulp")
	return err == nil && slices.Contains(strings.Fields(string(b)), "tls")
}

// logRuleLeg publishes and logs (once per rule start) the rule's body path.
func (g *Gateway) logRuleLeg(rule *config.Rule) {
	path, reason := ruleLeg(rule, g.leg.Path())
	g.Metrics.SetRuleDatapath(rule.ServiceID, path, reason)
	if reason == legReasonTLS {
		g.log.Info("rule body leg", "service", rule.ServiceID, "path", path, "reason",
			"TLS rule: the sockmap cannot move TLS records and kTLS is not built", "kernel_tls_ulp", kernelTLSAvailable())
		return
	}
	g.log.Info("rule body leg", "service", rule.ServiceID, "path", path, "reason", "--datapath="+g.opts.Datapath)
}

// tlsObserver feeds a rule's TLS counters.
type tlsObserver struct {
	m       *metrics.Metrics
	service int
}

func (o tlsObserver) HandshakeFailed(reason string) { o.m.TLSHandshakeFailed(o.service, reason) }
func (o tlsObserver) Reload(ok bool)                { o.m.TLSCertReload(o.service, ok) }

// ruleTLS loads a TLS rule's certificates and starts following their files
// until stop is called; a plain rule gets nil. A rule whose files are
// missing or unusable is refused with a 400 naming them.
func (g *Gateway) ruleTLS(rule *config.Rule) (t *tlsterm.Terminator, stop func(), err error) {
	if !rule.TerminatesTLS() {
		return nil, func() {}, nil
	}
	const field = "serviceArguments.security"
	if g.opts.TLSCertDir == "" {
		return nil, nil, &config.ValidationError{Field: field, Msg: fmt.Sprintf(
			"%s: %d terminates TLS, but kvgate was started without --tls-cert-dir; start it with --tls-cert-dir DIR and put the rule's certificate at DIR/<vip>_<port>/tls.crt and tls.key",
			field, rule.Args.Security)}
	}
	dir := rule.TLSCertDir(g.opts.TLSCertDir)
	if missing := tlsterm.MissingFiles(dir); len(missing) > 0 {
		return nil, nil, &config.ValidationError{Field: field, Msg: fmt.Sprintf("%s: %d needs the rule's certificate and key: missing %s",
			field, rule.Args.Security, strings.Join(missing, " and "))}
	}
	opts := tlsterm.Options{Dir: dir, ClientCertMode: rule.ClientCertMode(), ReloadInterval: g.opts.TLSReloadInterval,
		HandshakeTimeout: g.opts.TLSHandshakeTimeout, Observer: tlsObserver{g.Metrics, rule.ServiceID},
		Log: g.log.With("service", rule.ServiceID)}
	if f := rule.Args.MTLSFrontend; f != nil {
		opts.ClientCAFile = f.ClientCAPath
	}
	t, err = tlsterm.New(opts)
	if err != nil {
		return nil, nil, &config.ValidationError{Field: field, Msg: fmt.Sprintf("%s: %d: the rule's TLS files are unusable: %v", field, rule.Args.Security, err)}
	}
	g.Metrics.InitTLSRule(rule.ServiceID)
	ctx, cancel := context.WithCancel(context.Background())
	g.guard.Go(recovery.Poller, func() { t.Run(ctx) })
	g.log.Info("TLS termination", "service", rule.ServiceID, "dir", dir, "client_cert_mode", rule.ClientCertMode(), "sni_names", t.SNINames())
	return t, cancel, nil
}

// backendTLSDial is a security-2 rule's backend dialer: TCP (tagged for the
// load map like every backend socket), then a TLS 1.2+ handshake with the
// rule's engine TLS (tlsterm.EngineTLS: verified against
// mtls_backend.backend_ca_path, or the system's roots when empty, for the
// endpoint's IP, the CA file followed as it changes). Sessions are resumed
// from the rule's cache, so only the first connection to an engine pays the
// full handshake (bench: BenchmarkBackendTLSDial). The handshake is bounded
// by the caller's context (the connect timeout).
func (g *Gateway) backendTLSDial(engineTLS *tlsterm.EngineTLS) func(ctx context.Context, addr string) (net.Conn, error) {
	if engineTLS == nil {
		return nil
	}
	return newBackendTLSDialer(engineTLS, g.dialControl())
}

// ruleEngineTLS is a security-2 rule's TLS towards its engines, shared by
// the data-plane dialer and kvgate's own calls (engineclient); nil for the
// other rules. A CA file that does not load is a 400 naming the field.
func ruleEngineTLS(rule *config.Rule) (*tlsterm.EngineTLS, error) {
	if !rule.BackendTLS() {
		return nil, nil
	}
	caFile := ""
	if b := rule.Args.MTLSBackend; b != nil {
		caFile = b.BackendCAPath
	}
	e, err := tlsterm.NewEngineTLS(caFile)
	if err != nil {
		return nil, &config.ValidationError{Field: "serviceArguments.mtls_backend.backend_ca_path",
			Msg: fmt.Sprintf("serviceArguments.mtls_backend.backend_ca_path: %v", err)}
	}
	return e, nil
}

// backendPool is a rule's engine connection pool: security-2 rules only,
// whose every new connection costs a TLS handshake. Plain rules keep one
// connection per request: a TCP connect costs 36 µs here against the
// handshake's 500-900 µs, the sockmap leg takes ownership of its backend
// socket, and the BPF load map's count of established backend connections
// agrees with the in-flight count at rest only without idle connections
// (docs/security.md, "Engine connection pool").
func (g *Gateway) backendPool(rule *config.Rule) *fullproxy.PoolOptions {
	if !rule.BackendTLS() {
		return nil
	}
	g.Metrics.InitBackendPool(rule.ServiceID)
	o := g.opts.BackendPool
	return &o
}

func newBackendTLSDialer(engineTLS *tlsterm.EngineTLS, control func(network, address string, c syscall.RawConn) error) func(ctx context.Context, addr string) (net.Conn, error) {
	d := &net.Dialer{Control: control}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return engineTLS.Client(ctx, nc, addr)
	}
}
