package health

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
)

// Probe types (probetype).
const (
	ProbeHTTP = "http"
	ProbeTCP  = "tcp"
	ProbeNone = "none"
)

// Probe defaults.
const (
	DefaultProbeInterval = 5 * time.Second
	DefaultProbeTimeout  = 2 * time.Second
	DefaultProbePath     = "/health"
	DefaultMetricsPath   = "/metrics"
	// maxProbeBody bounds what an http probe reads of a response.
	maxProbeBody = 64 << 10
)

// ProbeConfig is a rule's probe settings.
type ProbeConfig struct {
	Type     string        // http | tcp | none (probetype)
	Port     int           // probeport; 0 means each endpoint's target port
	Path     string        // probereq, for http; default /health
	Timeout  time.Duration // probeTimeout; default 2 s
	Interval time.Duration // probeInterval; default 5 s
	// Scrape also reads each endpoint's engine /metrics every interval
	// (KV and P/D rules).
	Scrape      bool
	MetricsPath string // default /metrics, on the target port
	// Guard recovers a panic in one target's probe loop; nil still recovers.
	Guard *recovery.Guard
}

// Target is one endpoint to probe.
type Target struct {
	Ep   int
	Host string // IP address
	Port int    // targetPort
}

func (c ProbeConfig) withDefaults() (ProbeConfig, error) {
	c.Type = strings.ToLower(strings.TrimSpace(c.Type))
	switch c.Type {
	case "":
		c.Type = ProbeHTTP
	case ProbeHTTP, ProbeTCP, ProbeNone:
	default:
		return c, fmt.Errorf("probetype %q: want http, tcp or none", c.Type)
	}
	if c.Port < 0 || c.Port > 65535 {
		return c, fmt.Errorf("probeport %d: want 0..65535", c.Port)
	}
	if c.Path == "" {
		c.Path = DefaultProbePath
	}
	if !strings.HasPrefix(c.Path, "/") {
		c.Path = "/" + c.Path
	}
	if c.MetricsPath == "" {
		c.MetricsPath = DefaultMetricsPath
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultProbeTimeout
	}
	if c.Interval <= 0 {
		c.Interval = DefaultProbeInterval
	}
	return c, nil
}

// Prober runs the active probes and the engine scrape of one rule and feeds
// the results to its Tracker.
type Prober struct {
	tracker *Tracker
	cfg     ProbeConfig
	targets []Target
	client  *http.Client
	log     *slog.Logger

	mu      sync.Mutex
	missing map[string]bool // "<ep>/<family>" already logged as missing
}

// NewProber validates cfg and prepares the probes of targets.
func NewProber(t *Tracker, cfg ProbeConfig, targets []Target, log *slog.Logger) (*Prober, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("health: service %d: %w", t.serviceID, err)
	}
	for _, tg := range targets {
		if !t.members.Has(tg.Ep) {
			return nil, fmt.Errorf("health: service %d: target ep_idx %d is not an endpoint of the rule", t.serviceID, tg.Ep)
		}
		if tg.Port <= 0 || tg.Port > 65535 || tg.Host == "" {
			return nil, fmt.Errorf("health: service %d: ep_idx %d: bad address %q:%d", t.serviceID, tg.Ep, tg.Host, tg.Port)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       2 * cfg.Interval,
		ResponseHeaderTimeout: cfg.Timeout,
		DisableCompression:    true,
	}
	return &Prober{tracker: t, cfg: cfg, targets: targets, log: log, missing: map[string]bool{},
		client: &http.Client{Transport: tr, Timeout: cfg.Timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// Run probes every target each interval (the first at once) until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, tg := range p.targets {
		wg.Add(1)
		p.cfg.Guard.Go(recovery.Probe, func() {
			defer wg.Done()
			p.loop(ctx, tg)
		})
	}
	wg.Wait()
	p.client.CloseIdleConnections()
}

func (p *Prober) loop(ctx context.Context, tg Target) {
	ticker := time.NewTicker(p.cfg.Interval)
	defer ticker.Stop()
	for {
		p.Once(ctx, tg)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Once runs one probe (and scrape) of tg and applies the results.
func (p *Prober) Once(ctx context.Context, tg Target) {
	if p.cfg.Type != ProbeNone {
		ok := p.Probe(ctx, tg) == nil
		if ctx.Err() != nil {
			return // shutting down: not the endpoint's fault
		}
		p.tracker.ProbeResult(tg.Ep, ok)
	}
	if p.cfg.Scrape {
		if err := p.Scrape(ctx, tg); err != nil && ctx.Err() == nil {
			p.tracker.obs.ScrapeFailed(p.tracker.serviceID, tg.Ep)
			p.log.Debug("engine metrics scrape failed", "service", p.tracker.serviceID, "ep_idx", tg.Ep, "err", err)
		}
	}
}

func (p *Prober) probeAddr(tg Target) string {
	port := tg.Port
	if p.cfg.Port != 0 {
		port = p.cfg.Port
	}
	return net.JoinHostPort(tg.Host, strconv.Itoa(port))
}

// Probe runs one probe of tg: tcp passes when a connection opens, http
// when GET probereq answers 2xx, none always passes.
func (p *Prober) Probe(ctx context.Context, tg Target) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	addr := p.probeAddr(tg)
	switch p.cfg.Type {
	case ProbeNone:
		return nil
	case ProbeTCP:
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("tcp probe %s: %w", addr, err)
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+p.cfg.Path, nil)
	if err != nil {
		return fmt.Errorf("http probe %s: %w", addr, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("http probe %s: %w", addr, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("http probe %s%s: status %d", addr, p.cfg.Path, resp.StatusCode)
	}
	return nil
}

// Scrape reads tg's engine /metrics into the Tracker. A missing family
// leaves that value unknown and is logged once per endpoint and family.
func (p *Prober) Scrape(ctx context.Context, tg Target) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	addr := net.JoinHostPort(tg.Host, strconv.Itoa(tg.Port))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+p.cfg.MetricsPath, nil)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
		return fmt.Errorf("scrape %s: status %d", addr, resp.StatusCode)
	}
	m, err := ParseEngineMetrics(resp.Body)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, err)
	}
	p.noteMissing(tg.Ep, FamilyWaiting, m.Waiting < 0)
	p.noteMissing(tg.Ep, FamilyCacheConfig+" "+labelGPUBlocks, m.GPUBlocks < 0)
	now := p.tracker.clock.Now()
	p.tracker.SetEngineFigures(tg.Ep, m.GPUBlocks, m.Waiting, now)
	p.tracker.SetEngineLoad(tg.Ep, m.Running, m.Waiting, now)
	return nil
}

func (p *Prober) noteMissing(ep int, family string, missing bool) {
	key := strconv.Itoa(ep) + "/" + family
	p.mu.Lock()
	already := p.missing[key]
	if missing {
		p.missing[key] = true
	} else {
		delete(p.missing, key) // log again if it disappears later
	}
	p.mu.Unlock()
	if missing && !already {
		p.log.Warn("engine metric family missing; its value stays unknown", "service", p.tracker.serviceID, "ep_idx", ep, "family", family)
	}
}
