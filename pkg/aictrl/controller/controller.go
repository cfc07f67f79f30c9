package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
	"github.com/kvgate/kvgate/pkg/health"
)

// Options configure a Controller; zero values take the reference defaults.
type Options struct {
	EpochPeriod    time.Duration // --epoch-period-sec, 10 s
	ScrapeInterval time.Duration // --scrape-interval-sec, 5 s
	StaleBudget    time.Duration // --stale-budget-sec, 15 s
	Law            Law
	// Scheme is the scrape URL scheme, http unless the engines serve TLS.
	Scheme   string
	Client   *http.Client
	Registry prometheus.Registerer
	Log      *slog.Logger
	Now      func() time.Time
}

// Controller scrapes the registry's hosts, runs the weight law once per
// epoch and publishes each snapshot to every watcher.
type Controller struct {
	opts   Options
	bootID string
	m      *metrics
	log    *slog.Logger

	mu       sync.Mutex // guards everything below
	reg      *Registry
	hosts    map[string]*hostState // by IP
	epoch    uint64
	last     *pb.Snapshot
	watchers map[*watcher]struct{}
}

type hostState struct {
	lastOK     time.Time
	liveBlocks int64 // -1 unknown
	mismatch   bool
	law        damped
}

type watcher struct {
	gateway string
	ch      chan *pb.Snapshot // capacity 1: only the newest state matters
}

// New builds a Controller for reg.
func New(reg *Registry, opts Options) (*Controller, error) {
	if opts.EpochPeriod <= 0 {
		opts.EpochPeriod = time.Duration(reg.EpochPeriodSec) * time.Second
	}
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = 5 * time.Second
	}
	if opts.StaleBudget <= 0 {
		opts.StaleBudget = 15 * time.Second
	}
	if opts.Law == (Law{}) {
		opts.Law = DefaultLaw
	}
	if !(opts.Law.Alpha > 0 && opts.Law.Alpha <= 1) || opts.Law.DeadBand < 0 || opts.Law.MaxStep < 0 {
		return nil, fmt.Errorf("controller: ewma-alpha %v must be in (0,1], dead-band and max-step-pct not negative", opts.Law.Alpha)
	}
	if opts.Scheme == "" {
		opts.Scheme = "http"
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: min(opts.ScrapeInterval, 10*time.Second)}
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	c := &Controller{opts: opts, bootID: hex.EncodeToString(b[:]), m: m, log: opts.Log,
		watchers: map[*watcher]struct{}{}}
	c.SetRegistry(reg)
	return c, nil
}

// BootID identifies this process's run; a gateway accepts any epoch of a new
// boot_id.
func (c *Controller) BootID() string { return c.bootID }

// SetRegistry replaces the registry (a reload). Hosts that stay keep their
// scrape and law state.
func (c *Controller) SetRegistry(reg *Registry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.hosts
	c.reg, c.hosts = reg, map[string]*hostState{}
	for ip := range reg.Hosts {
		if h, ok := old[ip]; ok {
			c.hosts[ip] = h
		} else {
			c.hosts[ip] = &hostState{liveBlocks: -1}
		}
	}
}

// Run scrapes and emits until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	scrape := time.NewTicker(c.opts.ScrapeInterval)
	defer scrape.Stop()
	epoch := time.NewTicker(c.opts.EpochPeriod)
	defer epoch.Stop()
	c.ScrapeAll(ctx)
	c.Emit()
	for {
		select {
		case <-ctx.Done():
			return
		case <-scrape.C:
			c.ScrapeAll(ctx)
		case <-epoch.C:
			c.Emit()
		}
	}
}

// ScrapeAll scrapes every host once, in parallel, each bounded by the
// client's timeout.
func (c *Controller) ScrapeAll(ctx context.Context) {
	c.mu.Lock()
	reg := c.reg
	c.mu.Unlock()
	var wg sync.WaitGroup
	for ip := range reg.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.scrape(ctx, reg, ip)
		}()
	}
	wg.Wait()
}

func (c *Controller) scrape(ctx context.Context, reg *Registry, ip string) {
	url := c.opts.Scheme + "://" + reg.Addr(ip) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := c.opts.Client.Do(req)
	if err != nil {
		c.log.Debug("scrape failed", "source", ip, "err", err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.log.Debug("scrape failed", "source", ip, "status", resp.StatusCode)
		return
	}
	em, err := health.ParseEngineMetrics(resp.Body)
	if err != nil {
		c.log.Debug("scrape failed", "source", ip, "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[ip]
	if !ok {
		return
	}
	h.lastOK = c.opts.Now()
	h.liveBlocks = em.GPUBlocks
	expected := c.reg.Hosts[ip].ExpectedNumGPUBlocks
	mismatch := em.GPUBlocks >= 0 && em.GPUBlocks != expected
	if mismatch && !h.mismatch {
		// The discovered value wins as the KV capacity; the registry is only
		// an expectation (docs/controller.md, "Fallbacks").
		c.log.Warn("num_gpu_blocks differs from the registry; the discovered value wins", "source", ip,
			"discovered", em.GPUBlocks, "expected", expected)
		c.m.registryMismatch.WithLabelValues(ip).Inc()
	}
	h.mismatch = mismatch
}

// Emit runs the law for one epoch and publishes the snapshot. When every
// source is stale it emits nothing, so the gateways' deadline expires and
// they return to static weights.
func (c *Controller) Emit() *pb.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	ips := c.reg.HostIPs()
	srcs := make([]source, len(ips))
	fresh := 0
	for i, ip := range ips {
		h, st := c.reg.Hosts[ip], c.hosts[ip]
		age := now.Sub(st.lastOK)
		stale := st.lastOK.IsZero() || age > c.opts.StaleBudget
		if st.lastOK.IsZero() {
			age = 0
		}
		c.m.staleness.WithLabelValues(ip).Set(age.Seconds())
		c.m.stale.WithLabelValues(ip).Set(b2f(stale))
		if !stale {
			fresh++
		}
		srcs[i] = source{role: h.Role, prior: h.ServingThroughputPrior, stale: stale}
		if cal := h.Calibration; cal != nil && !stale && st.liveBlocks >= 0 {
			if v, ok := cal.FingerprintFields["num_gpu_blocks"]; ok && v != strconv.FormatInt(st.liveBlocks, 10) {
				// The calibrated ratio no longer describes this engine: the
				// prior stands in (it is what the law uses anyway; the ratio
				// feeds only the TTFT term, which kvgate does not implement).
				c.m.fingerprintMismatch.WithLabelValues(ip).Inc()
			}
		}
	}
	c.m.fleetStale.Set(b2f(fresh == 0))
	if fresh == 0 {
		return nil
	}
	c.epoch++
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	svc := &pb.ServiceSnapshot{ServiceKey: c.reg.Service.Key}
	for i, r := range raw(srcs) {
		ip := ips[i]
		h := c.reg.Hosts[ip]
		w := c.opts.Law.step(&c.hosts[ip].law, r)
		svc.Eps = append(svc.Eps, &pb.EpEntry{EpIdx: uint32(*h.EpIdx), EpAddr: c.reg.Addr(ip), Role: role(h.Role),
			Weight: w, State: state(h.State)})
		c.m.epWeight.WithLabelValues(c.reg.Service.Key, strconv.Itoa(*h.EpIdx)).Set(float64(w))
	}
	snap := &pb.Snapshot{
		Epoch:                   c.epoch,
		BootId:                  c.bootID,
		StalenessDeadlineUnixMs: uint64(now.Add(3 * c.opts.EpochPeriod).UnixMilli()),
		Services:                []*pb.ServiceSnapshot{svc},
		MinApplierVersion:       1,
		Nonce:                   hex.EncodeToString(nonce[:]),
	}
	c.last = snap
	c.m.emitted.Inc()
	c.m.epoch.Set(float64(c.epoch))
	for w := range c.watchers {
		c.offer(w, snap)
	}
	return snap
}

// offer hands snap to w, replacing an unsent older snapshot: snapshots are
// full state, so a slow gateway needs only the newest.
func (c *Controller) offer(w *watcher, snap *pb.Snapshot) {
	select {
	case w.ch <- snap:
		return
	default:
	}
	select {
	case <-w.ch:
		c.m.dropped.WithLabelValues(w.gateway).Inc()
	default:
	}
	select {
	case w.ch <- snap:
	default:
	}
}

// maxWatchers bounds the streams one controller serves.
const maxWatchers = 1024

func (c *Controller) addWatcher(gateway string) *watcher {
	w := &watcher{gateway: gateway, ch: make(chan *pb.Snapshot, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.watchers) >= maxWatchers {
		return nil
	}
	c.watchers[w] = struct{}{}
	c.m.watchers.Set(float64(len(c.watchers)))
	if c.last != nil && c.opts.Now().UnixMilli() < int64(c.last.StalenessDeadlineUnixMs) {
		w.ch <- c.last
	}
	return w
}

func (c *Controller) removeWatcher(w *watcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.watchers, w)
	c.m.watchers.Set(float64(len(c.watchers)))
}

func role(s string) pb.Role {
	if s == "decode" {
		return pb.Role_ROLE_DECODE
	}
	return pb.Role_ROLE_PREFILL
}

func state(s string) pb.EpState {
	switch s {
	case "draining":
		return pb.EpState_EP_STATE_DRAINING
	case "disabled":
		return pb.EpState_EP_STATE_DISABLED
	}
	return pb.EpState_EP_STATE_ACTIVE
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
