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
	"github.com/kvgate/kvgate/pkg/engineclient"
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
	Scrape bool
	// ScrapeInterval, when positive and shorter than Interval, runs the
	// scrape on its own ticker at this interval instead of with each probe,
	// so the engines' load (the replicas' shared load view,
	// docs/replicas.md) is fresher than the probe.
	ScrapeInterval time.Duration
	MetricsPath    string // default /metrics, on the target port
	// Guard recovers a panic in one target's probe loop; nil still recovers.
	Guard *recovery.Guard
	// Token, when set, is the rule's backendTokenFile: its token goes as
	// Authorization: Bearer on the http probe and the scrape (never on
	// clients' requests; docs/security.md).
	Token TokenSource
	// Engine is the rule's engine-facing client (https on security-2
	// rules); nil means plain HTTP with a client of the prober's own.
	Engine *engineclient.Client
}

// TokenSource supplies the bearer token kvgate sends to a rule's engines
// (*apiauth.BackendToken follows the rule's backendTokenFile). token is ""
// when none is in force; err is the last failure to load one.
type TokenSource interface {
	Token() (token string, err error)
}

// ReasonEngineWantsToken explains a 401 from an engine called without a token:
// the rule needs backendTokenFile.
const ReasonEngineWantsToken = "engine requires a token (backendTokenFile)"

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
	// lastErr is each target's last probe and scrape failure as logged
	// ("probe/<ep>", "scrape/<ep>"), so a failing endpoint logs its reason
	// once, and again only when it changes.
	lastErr map[string]string
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
	if cfg.Engine == nil {
		cfg.Engine = engineclient.New(nil)
	}
	return &Prober{tracker: t, cfg: cfg, targets: targets, log: log, missing: map[string]bool{}, lastErr: map[string]string{},
		client: cfg.Engine.HTTP(cfg.Timeout)}, nil
}

// Run probes every target each interval (the first at once) until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, tg := range p.targets {
		wg.Add(1)
		p.cfg.Guard.Go(recovery.Probe, func() {
			defer wg.Done()
			p.loop(ctx, p.cfg.Interval, func() { p.Once(ctx, tg) })
		})
		if p.separateScrape() {
			wg.Add(1)
			p.cfg.Guard.Go(recovery.Probe, func() {
				defer wg.Done()
				p.loop(ctx, p.cfg.ScrapeInterval, func() { p.scrapeOnce(ctx, tg) })
			})
		}
	}
	wg.Wait()
	p.client.CloseIdleConnections()
}

// separateScrape reports that the scrape runs on its own, faster ticker.
func (p *Prober) separateScrape() bool {
	return p.cfg.Scrape && p.cfg.ScrapeInterval > 0 && p.cfg.ScrapeInterval < p.cfg.Interval
}

func (p *Prober) loop(ctx context.Context, every time.Duration, once func()) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		once()
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
		err := p.Probe(ctx, tg)
		if ctx.Err() != nil {
			return // shutting down: not the endpoint's fault
		}
		p.noteFailure("probe", tg.Ep, err)
		if err != nil {
			p.tracker.setProbeError(tg.Ep, err.Error())
		} else {
			p.tracker.setProbeError(tg.Ep, "")
		}
		p.tracker.ProbeResult(tg.Ep, err == nil)
	}
	if p.cfg.Scrape && !p.separateScrape() {
		p.scrapeOnce(ctx, tg)
	}
}

// scrapeOnce runs one scrape of tg and counts and logs its failure.
func (p *Prober) scrapeOnce(ctx context.Context, tg Target) {
	err := p.Scrape(ctx, tg)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		p.tracker.obs.ScrapeFailed(p.tracker.serviceID, tg.Ep)
	}
	p.noteFailure("scrape", tg.Ep, err)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.Engine.Scheme()+"://"+addr+p.cfg.Path, nil)
	if err != nil {
		return fmt.Errorf("http probe %s: %w", addr, err)
	}
	sent := p.authorize(req)
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("http probe %s: %w", addr, engineclient.Explain(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("http probe %s%s: status %s", addr, p.cfg.Path, p.explainStatus(resp.StatusCode, sent))
	}
	return nil
}

// authorize adds the rule's backend token to one of kvgate's own requests;
// it reports whether a token was sent.
func (p *Prober) authorize(req *http.Request) bool {
	if p.cfg.Token == nil {
		return false
	}
	tok, _ := p.cfg.Token.Token()
	if tok == "" {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	return true
}

// explainStatus spells a refused status so the log says what to fix: a 401
// without a token means the rule needs backendTokenFile; with one, the
// engine's key is not the file's (a rotation half done).
func (p *Prober) explainStatus(code int, sent bool) string {
	if code != http.StatusUnauthorized && code != http.StatusForbidden {
		return strconv.Itoa(code)
	}
	if sent {
		return strconv.Itoa(code) + ": engine refused the token of backendTokenFile (is it the engine's current key?)"
	}
	msg := strconv.Itoa(code) + ": " + ReasonEngineWantsToken
	if p.cfg.Token != nil {
		if _, err := p.cfg.Token.Token(); err != nil {
			msg += "; no token in force: " + err.Error()
		}
	}
	return msg
}

// noteFailure logs a target's probe or scrape failure when its reason
// changes, so an endpoint that keeps failing logs once, not every interval.
func (p *Prober) noteFailure(kind string, ep int, err error) {
	key := kind + "/" + strconv.Itoa(ep)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	p.mu.Lock()
	changed := p.lastErr[key] != msg
	if msg == "" {
		delete(p.lastErr, key)
	} else {
		p.lastErr[key] = msg
	}
	p.mu.Unlock()
	if changed && err != nil {
		p.log.Warn("endpoint "+kind+" failed", "service", p.tracker.serviceID, "ep_idx", ep, "err", msg)
	}
}

// Scrape reads tg's engine /metrics into the Tracker. A missing family
// leaves that value unknown and is logged once per endpoint and family.
func (p *Prober) Scrape(ctx context.Context, tg Target) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	addr := net.JoinHostPort(tg.Host, strconv.Itoa(tg.Port))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.Engine.Scheme()+"://"+addr+p.cfg.MetricsPath, nil)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, err)
	}
	sent := p.authorize(req)
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, engineclient.Explain(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
		return fmt.Errorf("scrape %s%s: status %s", addr, p.cfg.MetricsPath, p.explainStatus(resp.StatusCode, sent))
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
	p.tracker.obs.EngineFigures(p.tracker.serviceID, tg.Ep, m.GPUBlocks, m.Waiting)
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
