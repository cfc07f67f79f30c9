// Package aictrl is kvgate's side of the experimental AI controller: it
// dials out to the controller, validates each full-state snapshot against
// the rules, applies it to the selectors in one step and acknowledges it,
// and falls back to static weights past the snapshot's deadline
// (docs/controller.md). Nothing runs unless LOXILB_AI_CTRL_ADDR is set.
package aictrl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/selector"
)

// ApplierVersion is what this applier implements; a snapshot that needs a
// newer one is rejected.
const ApplierVersion = 1

// Bounds on one snapshot.
const (
	maxServices   = 1024
	maxSnapshot   = 4 << 20
	maxBackoff    = 10 * time.Second
	minBackoff    = 200 * time.Millisecond
	maxDetailSize = 4096
	// maxDeadline bounds how far ahead a snapshot may hold: a controller
	// bug cannot pin advice (or a jitter wait) for longer.
	maxDeadline = time.Hour
)

// KeepaliveTime is how often an idle gateway connection is pinged.
const KeepaliveTime = 10 * time.Second

// KeepaliveEnforcement is the controller's policy that admits the
// gateways' pings (gRPC's default refuses pings more often than 5 min).
func KeepaliveEnforcement() keepalive.EnforcementPolicy {
	return keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true}
}

// Target is the gateway as the applier sees it.
type Target interface {
	// AdviceEndpoints is the ep_idx → "ip:port" map of the rule with this
	// service key ("vip:port:proto"), false when no rule has it.
	AdviceEndpoints(serviceKey string) (map[int]string, bool)
	// SetAdvice applies adv to that rule's selector (nil: static weights).
	SetAdvice(serviceKey string, adv *selector.Advice)
	// Unavailable is the rule's locally down endpoints.
	Unavailable(serviceKey string) epset.Set
}

// Config is the applier's environment (docs/controller.md, "Enabling").
type Config struct {
	Addr        string        // LOXILB_AI_CTRL_ADDR
	GatewayID   string        // LOXILB_AI_CTRL_GATEWAY_ID, default the host name
	DecayWindow time.Duration // LOXILB_AI_CTRL_DECAY_WINDOW_SEC (0: drop at once)
	Hysteresis  time.Duration // LOXILB_AI_CTRL_HYSTERESIS_SEC (0: none)
	AckTimeout  time.Duration // LOXILB_AI_CTRL_ACK_TIMEOUT_SEC (5 s)
	JitterPct   int           // LOXILB_AI_CTRL_APPLY_JITTER_PCT (0)
	TLS         ClientTLS
}

// ConfigFromEnv reads the applier's variables. ok is false when
// LOXILB_AI_CTRL_ADDR is unset: no controller, the default.
func ConfigFromEnv(getenv func(string) string) (c Config, ok bool, err error) {
	c.Addr = strings.TrimSpace(getenv("LOXILB_AI_CTRL_ADDR"))
	if c.Addr == "" {
		return c, false, nil
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return c, false, fmt.Errorf("LOXILB_AI_CTRL_ADDR=%q: want host:port: %w", c.Addr, err)
	}
	secs := func(name string, def, hi int) (time.Duration, error) {
		v := getenv(name)
		if v == "" {
			return time.Duration(def) * time.Second, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > hi {
			return 0, fmt.Errorf("%s=%q: want 0..%d seconds", name, v, hi)
		}
		return time.Duration(n) * time.Second, nil
	}
	if c.DecayWindow, err = secs("LOXILB_AI_CTRL_DECAY_WINDOW_SEC", 0, 3600); err != nil {
		return c, false, err
	}
	if c.Hysteresis, err = secs("LOXILB_AI_CTRL_HYSTERESIS_SEC", 0, 3600); err != nil {
		return c, false, err
	}
	if c.AckTimeout, err = secs("LOXILB_AI_CTRL_ACK_TIMEOUT_SEC", 5, 300); err != nil {
		return c, false, err
	}
	if c.AckTimeout == 0 {
		return c, false, errors.New("LOXILB_AI_CTRL_ACK_TIMEOUT_SEC=0: want 1..300 seconds")
	}
	if v := getenv("LOXILB_AI_CTRL_APPLY_JITTER_PCT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			return c, false, fmt.Errorf("LOXILB_AI_CTRL_APPLY_JITTER_PCT=%q: want 0..100", v)
		}
		c.JitterPct = n
	}
	c.GatewayID = getenv("LOXILB_AI_CTRL_GATEWAY_ID")
	if c.GatewayID == "" {
		c.GatewayID = "kvgate"
		if h, err := os.Hostname(); err == nil && h != "" {
			c.GatewayID = h
		}
	}
	if len(c.GatewayID) > 128 {
		return c, false, errors.New("LOXILB_AI_CTRL_GATEWAY_ID: at most 128 bytes")
	}
	c.TLS = ClientTLS{Addr: c.Addr, CAFile: getenv("LOXILB_AI_CTRL_TLS_CA"), CertFile: getenv("LOXILB_AI_CTRL_TLS_CERT"),
		KeyFile: getenv("LOXILB_AI_CTRL_TLS_KEY"), ServerName: getenv("LOXILB_AI_CTRL_TLS_SERVER_NAME")}
	switch v := getenv("LOXILB_AI_CTRL_INSECURE"); v {
	case "", "0", "false":
	case "1", "true":
		c.TLS.Insecure = true
	default:
		return c, false, fmt.Errorf("LOXILB_AI_CTRL_INSECURE=%q: want 0 or 1", v)
	}
	if _, err := ClientCredentials(c.TLS); err != nil {
		return c, false, err
	}
	return c, true, nil
}

// Mode values of loxilb_pd_ctrl_mode.
const (
	ModeStatic   = 0 // no advice in force
	ModeAdvised  = 1 // a snapshot within its deadline
	ModeDecaying = 2 // past the deadline, weights returning to static
)

// epAdvice is one endpoint's advice in force, with the hysteresis state.
type epAdvice struct {
	weight       int
	state        pb.EpState // applied
	pending      pb.EpState
	pendingSince time.Time
}

// Applier watches one controller and applies its snapshots.
type Applier struct {
	cfg    Config
	target Target
	log    *slog.Logger
	m      *Metrics
	now    func() time.Time
	creds  credentials.TransportCredentials

	mu         sync.Mutex // guards below
	bootID     string
	epoch      uint64
	have       bool
	deadline   time.Time
	advised    map[string]map[int]*epAdvice // service key → ep_idx → advice
	mode       int
	decayStart time.Time
}

// NewApplier builds an applier; reg receives the loxilb_pd_ctrl_* series.
func NewApplier(cfg Config, target Target, reg prometheus.Registerer, log *slog.Logger) (*Applier, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	if cfg.TLS.Addr == "" {
		cfg.TLS.Addr = cfg.Addr
	}
	creds, err := ClientCredentials(cfg.TLS)
	if err != nil {
		return nil, err
	}
	m, err := NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Applier{cfg: cfg, target: target, log: log, m: m, now: time.Now, creds: creds,
		advised: map[string]map[int]*epAdvice{}}, nil
}

// Mode is the current loxilb_pd_ctrl_mode.
func (a *Applier) Mode() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mode
}

// Run watches the controller until ctx ends, reconnecting with capped
// exponential backoff; the deadline is enforced whether connected or not.
func (a *Applier) Run(ctx context.Context) error {
	// Keepalive pings notice a controller that vanished without closing
	// the connection (a partition), so the stream is redialled; the
	// controller permits them (KeepaliveEnforcement).
	conn, err := grpc.NewClient(a.cfg.Addr, grpc.WithTransportCredentials(a.creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxSnapshot)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: 5 * time.Second}))
	if err != nil {
		return fmt.Errorf("ai controller %s: %w", a.cfg.Addr, err)
	}
	defer conn.Close()
	cl := pb.NewAiCtrlClient(conn)
	go a.expiry(ctx)
	backoff := minBackoff
	for ctx.Err() == nil {
		got, err := a.watch(ctx, cl)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			backoff = minBackoff
		}
		a.log.Warn("ai controller stream lost; reconnecting", "addr", a.cfg.Addr, "err", err, "in", backoff)
		t := time.NewTimer(backoff + rand.N(backoff/2))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
	return nil
}

// watch runs one stream; got reports whether any snapshot arrived.
func (a *Applier) watch(ctx context.Context, cl pb.AiCtrlClient) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := cl.WatchSnapshots(sctx, &pb.WatchRequest{GatewayId: a.cfg.GatewayID, ApplierVersion: ApplierVersion})
	if err != nil {
		return false, err
	}
	for {
		snap, err := st.Recv()
		if err != nil {
			return got, err
		}
		got = true
		a.jitter(ctx, snap)
		status, detail, ok := a.Handle(snap)
		if !ok {
			continue
		}
		actx, acancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
		_, err = cl.AckSnapshot(actx, &pb.Ack{Epoch: snap.GetEpoch(), Nonce: snap.GetNonce(), Status: status,
			ErrorDetail: detail, GatewayId: a.cfg.GatewayID})
		acancel()
		if err != nil {
			a.log.Warn("ai controller ack failed", "epoch", snap.GetEpoch(), "err", err)
		}
	}
}

// jitter spreads the gateways' applies over JitterPct of the epoch (a third
// of the time to the deadline), so a fleet does not move in lockstep.
func (a *Applier) jitter(ctx context.Context, snap *pb.Snapshot) {
	if a.cfg.JitterPct <= 0 {
		return
	}
	left := time.UnixMilli(int64(min(snap.GetStalenessDeadlineUnixMs(), 1<<62))).Sub(a.now())
	span := min(left, maxDeadline) / 3 * time.Duration(a.cfg.JitterPct) / 100
	if span <= 0 {
		return
	}
	t := time.NewTimer(rand.N(span))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Handle validates and applies one snapshot. ok is false for a snapshot
// the acceptance rule ignores (neither a new boot_id nor a greater epoch),
// which is not acknowledged; otherwise status and detail are the ack.
func (a *Applier) Handle(snap *pb.Snapshot) (status pb.AckStatus, detail string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.have && snap.GetBootId() == a.bootID && snap.GetEpoch() <= a.epoch {
		a.log.Debug("ai controller snapshot ignored: not newer", "epoch", snap.GetEpoch(), "applied", a.epoch)
		return 0, "", false
	}
	plan, err := a.validate(snap)
	if err != nil {
		a.m.nacks.Inc()
		detail := err.Error()
		if len(detail) > maxDetailSize {
			detail = detail[:maxDetailSize]
		}
		a.log.Warn("ai controller snapshot rejected", "epoch", snap.GetEpoch(), "boot_id", snap.GetBootId(), "err", detail)
		return pb.AckStatus_ACK_STATUS_REJECTED, detail, true
	}
	a.apply(snap, plan)
	return pb.AckStatus_ACK_STATUS_APPLIED, "", true
}

// plan is a validated snapshot: service key → ep_idx → entry.
type plan map[string]map[int]*pb.EpEntry

func (a *Applier) validate(snap *pb.Snapshot) (plan, error) {
	if v := snap.GetMinApplierVersion(); v > ApplierVersion {
		return nil, fmt.Errorf("min_applier_version %d: this applier is version %d", v, ApplierVersion)
	}
	if snap.GetBootId() == "" {
		return nil, errors.New("boot_id: empty")
	}
	if dl := snap.GetStalenessDeadlineUnixMs(); dl > 1<<62 || !a.now().Before(time.UnixMilli(int64(dl))) {
		return nil, fmt.Errorf("staleness_deadline_unix_ms %d: already past", dl)
	} else if time.UnixMilli(int64(dl)).Sub(a.now()) > maxDeadline {
		return nil, fmt.Errorf("staleness_deadline_unix_ms %d: more than %s ahead", dl, maxDeadline)
	}
	if len(snap.GetServices()) > maxServices {
		return nil, fmt.Errorf("services: %d: at most %d", len(snap.GetServices()), maxServices)
	}
	p := plan{}
	for _, svc := range snap.GetServices() {
		key, err := CanonicalServiceKey(svc.GetServiceKey())
		if err != nil {
			return nil, err
		}
		if _, dup := p[key]; dup {
			return nil, fmt.Errorf("service_key %q: twice in one snapshot", svc.GetServiceKey())
		}
		have, ok := a.target.AdviceEndpoints(key)
		if !ok {
			return nil, fmt.Errorf("service_key %q: no such rule on this gateway", svc.GetServiceKey())
		}
		if p[key], err = validateService(key, svc.GetEps(), have); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// validateService checks one service's entries against the rule's
// endpoints; every ep_addr mismatch is listed, with what kvgate expected.
func validateService(key string, entries []*pb.EpEntry, have map[int]string) (map[int]*pb.EpEntry, error) {
	if len(entries) > epset.Max {
		return nil, fmt.Errorf("service %s: %d eps: at most %d", key, len(entries), epset.Max)
	}
	var problems []string
	eps := map[int]*pb.EpEntry{}
	for _, e := range entries {
		idx := int(e.GetEpIdx())
		switch {
		case e.GetEpIdx() >= epset.Max:
			return nil, fmt.Errorf("service %s: ep_idx %d: out of range", key, e.GetEpIdx())
		case eps[idx] != nil:
			return nil, fmt.Errorf("service %s: ep_idx %d: twice", key, idx)
		case e.GetWeight() > 100:
			return nil, fmt.Errorf("service %s: ep_idx %d: weight %d: want 0..100", key, idx, e.GetWeight())
		case e.GetState() > pb.EpState_EP_STATE_DISABLED:
			return nil, fmt.Errorf("service %s: ep_idx %d: state %d unknown", key, idx, e.GetState())
		}
		want, ok := have[idx]
		got, gerr := canonicalAddr(e.GetEpAddr())
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("ep_idx %d (%s): no such endpoint", idx, e.GetEpAddr()))
		case gerr != nil || got != want:
			problems = append(problems, fmt.Sprintf("ep_idx %d: ep_addr %s, expected %s", idx, e.GetEpAddr(), want))
		}
		eps[idx] = e
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("service %s: %s; kvgate numbers ep_idx in the order endpoints were posted: %s",
			key, strings.Join(problems, "; "), describe(have))
	}
	return eps, nil
}

// describe lists a rule's ep_idx → ep_addr, so a NACK tells the operator
// exactly what the registry must say.
func describe(have map[int]string) string {
	idx := make([]int, 0, len(have))
	for i := range have {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	parts := make([]string, len(idx))
	for i, x := range idx {
		parts[i] = fmt.Sprintf("%d=%s", x, have[x])
	}
	return strings.Join(parts, ", ")
}

// apply swaps in a validated snapshot: every service in it, and static
// weights for any service advised before but absent now (full state).
func (a *Applier) apply(snap *pb.Snapshot, p plan) {
	now := a.now()
	next := map[string]map[int]*epAdvice{}
	advice := map[string]*selector.Advice{}
	overrides := 0
	for key, eps := range p {
		prev := a.advised[key]
		cur := map[int]*epAdvice{}
		adv := &selector.Advice{Weight: map[int]int{}}
		down := a.target.Unavailable(key)
		for idx, e := range eps {
			ea := a.next(e, prev[idx], now)
			cur[idx] = ea
			adv.Weight[idx] = ea.weight
			switch ea.state {
			case pb.EpState_EP_STATE_DRAINING:
				adv.Draining.Add(idx)
			case pb.EpState_EP_STATE_DISABLED:
				adv.Disabled.Add(idx)
			}
			if down.Has(idx) && ea.state != pb.EpState_EP_STATE_DISABLED {
				overrides++ // local health wins over the advice
			}
		}
		next[key] = cur
		advice[key] = adv
	}
	for key := range a.advised {
		if _, ok := next[key]; !ok {
			a.target.SetAdvice(key, nil)
			a.m.static(key, a.target)
		}
	}
	for key, adv := range advice {
		a.target.SetAdvice(key, adv)
		for idx, ea := range next[key] {
			a.m.ep(key, idx, ea.weight, ea.state)
		}
		a.m.appliedEpoch.WithLabelValues(key).Set(float64(snap.GetEpoch()))
	}
	if a.mode != ModeAdvised {
		a.log.Info("ai controller advice applied", "epoch", snap.GetEpoch(), "boot_id", snap.GetBootId(), "services", len(p))
	}
	a.advised = next
	a.bootID, a.epoch, a.have = snap.GetBootId(), snap.GetEpoch(), true
	a.deadline = time.UnixMilli(int64(snap.GetStalenessDeadlineUnixMs()))
	a.mode = ModeAdvised
	a.m.mode.Set(ModeAdvised)
	a.m.alpha.Set(1)
	a.m.applied.Inc()
	a.m.overrides.Add(float64(overrides))
}

// next is an endpoint's advice after this snapshot. Hysteresis: a state
// change takes effect once it has been advised for the whole window.
func (a *Applier) next(e *pb.EpEntry, old *epAdvice, now time.Time) *epAdvice {
	st := e.GetState()
	if st == pb.EpState_EP_STATE_UNSPECIFIED {
		st = pb.EpState_EP_STATE_ACTIVE
	}
	ea := &epAdvice{weight: int(e.GetWeight()), state: st, pending: st, pendingSince: now}
	if old == nil || a.mode != ModeAdvised {
		return ea
	}
	ea.state, ea.pending, ea.pendingSince = old.state, old.pending, old.pendingSince
	if st != old.pending {
		ea.pending, ea.pendingSince = st, now
	}
	if ea.pending != ea.state && now.Sub(ea.pendingSince) >= a.cfg.Hysteresis {
		ea.state = ea.pending
	}
	return ea
}

// expiry enforces the deadline once a second.
func (a *Applier) expiry(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Tick()
		}
	}
}

// Tick applies the staleness deadline: past it the advice is dropped (or,
// with a decay window, its weights slide back to 100 over the window; the
// DRAINING/DISABLED states are dropped at once).
func (a *Applier) Tick() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.mode == ModeStatic || now.Before(a.deadline) {
		return
	}
	if a.mode == ModeAdvised {
		a.log.Warn("ai controller advice is past its staleness deadline; returning to static weights",
			"epoch", a.epoch, "deadline", a.deadline.UTC().Format(time.RFC3339), "decay_window", a.cfg.DecayWindow)
		a.decayStart = now
		a.mode = ModeDecaying
		a.m.mode.Set(ModeDecaying)
	}
	alpha := 0.0
	if a.cfg.DecayWindow > 0 {
		alpha = 1 - float64(now.Sub(a.decayStart))/float64(a.cfg.DecayWindow)
	}
	if alpha <= 0 {
		for key := range a.advised {
			a.target.SetAdvice(key, nil)
			a.m.static(key, a.target)
		}
		a.advised = map[string]map[int]*epAdvice{}
		a.mode = ModeStatic
		a.m.mode.Set(ModeStatic)
		a.m.alpha.Set(0)
		a.log.Info("ai controller advice dropped; static weights in force")
		return
	}
	for key, eps := range a.advised {
		adv := &selector.Advice{Weight: map[int]int{}}
		for idx, ea := range eps {
			w := int(100 + (float64(ea.weight)-100)*alpha + 0.5)
			adv.Weight[idx] = w
			a.m.ep(key, idx, w, pb.EpState_EP_STATE_ACTIVE)
		}
		a.target.SetAdvice(key, adv)
	}
	a.m.alpha.Set(alpha)
}

// CanonicalServiceKey parses "vip:port:proto" (an IPv6 VIP may be bracketed)
// into its canonical form: the VIP as netip prints it, the protocol lower
// case.
func CanonicalServiceKey(s string) (string, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return "", fmt.Errorf("service_key %q: want vip:port:proto", s)
	}
	proto := strings.ToLower(s[i+1:])
	hp := s[:i]
	j := strings.LastIndexByte(hp, ':')
	if j <= 0 || proto == "" {
		return "", fmt.Errorf("service_key %q: want vip:port:proto", s)
	}
	ip, err := netip.ParseAddr(strings.Trim(hp[:j], "[]"))
	port, perr := strconv.Atoi(hp[j+1:])
	if err != nil || perr != nil || port < 0 || port > 65535 {
		return "", fmt.Errorf("service_key %q: want vip:port:proto", s)
	}
	return ServiceKey(ip.String(), port, proto), nil
}

// ServiceKey formats a rule's key as the controller names it.
func ServiceKey(vip string, port int, proto string) string {
	if ip, err := netip.ParseAddr(vip); err == nil {
		vip = ip.Unmap().String()
	}
	return vip + ":" + strconv.Itoa(port) + ":" + strings.ToLower(proto)
}

func canonicalAddr(s string) (string, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", err
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), nil
}

// EndpointAddr formats a rule endpoint as the controller names it.
func EndpointAddr(ip string, port int) string {
	if a, err := netip.ParseAddr(ip); err == nil {
		return netip.AddrPortFrom(a.Unmap(), uint16(port)).String()
	}
	return net.JoinHostPort(ip, strconv.Itoa(port))
}
