package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// config is one benchmark run.
type config struct {
	kvgate, repo     string
	endpoints        int
	hashes, batch    int
	tokens           bool
	churn            time.Duration
	churnRate        float64
	sample           time.Duration
	series           string
	env              []string
	fillTimeoutFloor time.Duration // 0: 60 s
	settle           time.Duration // pause between the fill and its memory reading (0: 2 s)
}

// maxEndpoints bounds the publishers (and processes) one run starts.
const maxEndpoints = 64

func (c *config) validate() error {
	switch {
	case c.endpoints < 1 || c.endpoints > maxEndpoints:
		return fmt.Errorf("--endpoints=%d: want 1-%d", c.endpoints, maxEndpoints)
	case c.hashes < c.endpoints || c.hashes > 100_000_000:
		return fmt.Errorf("--hashes=%d: want %d-100000000", c.hashes, c.endpoints)
	case c.batch < 1 || c.batch > 65536:
		return fmt.Errorf("--batch=%d: want 1-65536", c.batch)
	case c.churnRate < 0:
		return fmt.Errorf("--churn-rate=%g: want >= 0", c.churnRate)
	case c.churn < 0 || c.churn > 24*time.Hour:
		return fmt.Errorf("--churn=%s: want 0-24h", c.churn)
	}
	if c.sample <= 0 {
		c.sample = time.Second
	}
	return nil
}

// perEndpoint is the fill share of one endpoint, rounded up to whole batches.
func (c *config) perEndpoint() int {
	n := (c.hashes + c.endpoints - 1) / c.endpoints
	return (n + c.batch - 1) / c.batch * c.batch
}

// poolBatches is how many batches beyond the fill each publisher encodes
// for the churn ring: enough that a removed hash stays out for a while,
// bounded so the publishers' memory stays a fraction of the fill's.
func (c *config) poolBatches() int {
	if c.churn == 0 {
		return 0
	}
	return max(4, c.perEndpoint()/c.batch/4)
}

// result is what one run measured.
type result struct {
	Endpoints int      `json:"endpoints"`
	Hashes    int      `json:"hashes"`
	Batch     int      `json:"batch"`
	Tokens    bool     `json:"tokens"`
	LoadAvg   string   `json:"load_avg_before"`
	Env       []string `json:"env,omitempty"`
	Fill      fill     `json:"fill"`
	Churn     *churn   `json:"churn,omitempty"`
}

type fill struct {
	Blocks           int     `json:"blocks"`
	StoredCounter    int     `json:"stored_hashes_counter"`
	Seconds          float64 `json:"seconds"`
	HashesPerSec     float64 `json:"hashes_per_s"`
	PublisherSeconds float64 `json:"publisher_seconds_max"`
	PublisherRate    float64 `json:"publisher_hashes_per_s"`
	PublisherCPU     float64 `json:"publisher_cpu_s"`
	DaemonCPU        float64 `json:"daemon_cpu_s"`
	DaemonCPUPerHash float64 `json:"daemon_cpu_ns_per_hash"`
	Limit            string  `json:"limited_by"`
	Before           memory  `json:"before"`
	Peak             memory  `json:"peak"`
	After            memory  `json:"after"`
	RSSPerHash       float64 `json:"rss_bytes_per_hash"`
	RSSDeltaPerHash  float64 `json:"rss_delta_bytes_per_hash"`
	HWMPerHash       float64 `json:"hwm_bytes_per_hash"`
	HeapPerHash      float64 `json:"heap_inuse_bytes_per_hash"`
	OffHeapPerHash   float64 `json:"rss_minus_go_sys_bytes_per_hash"`
}

type churn struct {
	Seconds       float64 `json:"seconds"`
	TargetRate    float64 `json:"target_hashes_per_s"`
	PublishedRate float64 `json:"published_hashes_per_s"`
	AppliedRate   float64 `json:"applied_hashes_per_s"`
	DaemonCPU     float64 `json:"daemon_cpu_s"`
	Blocks        int     `json:"blocks_end"`
	Published     int     `json:"published_hashes"`
	Applied       int     `json:"applied_hashes"`
	RSSSecondQ    float64 `json:"rss_median_second_quarter"`
	RSSLastQ      float64 `json:"rss_median_last_quarter"`
	GrowthBytes   float64 `json:"rss_growth_bytes"`
	HWM           float64 `json:"hwm_end"`
	HeapLastQ     float64 `json:"heap_inuse_median_last_quarter"`
	Flat          bool    `json:"flat"`
}

// memory is one snapshot of the daemon's memory.
type memory struct {
	RSS       float64 `json:"vm_rss"`
	HWM       float64 `json:"vm_hwm"`
	HeapInuse float64 `json:"go_heap_inuse"`
	HeapIdle  float64 `json:"go_heap_idle"`
	Released  float64 `json:"go_heap_released"`
	GoSys     float64 `json:"go_sys"`
}

func run(c config, log *slog.Logger) (*result, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	repo, err := filepath.Abs(c.repo)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "kvgate-ingestbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := c.kvgate
	if bin == "" {
		bin = filepath.Join(tmp, "kvgate")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/kvgate")
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/kvgate: %w\n%s", err, out)
		}
	}
	net, err := pickNetwork(c.endpoints)
	if err != nil {
		return nil, err
	}
	res := &result{Endpoints: c.endpoints, Hashes: c.perEndpoint() * c.endpoints, Batch: c.batch, Tokens: c.tokens,
		LoadAvg: loadAvg(), Env: c.env}
	pubs, err := startPublishers(repo, net, c)
	if err != nil {
		return nil, err
	}
	defer pubs.stop()
	maxBlocks := max(1000, c.perEndpoint()+(c.poolBatches()+2)*c.batch)
	d, err := startDaemon(bin, repo, tmp, net, append([]string{fmt.Sprintf("LOXILB_KV_MAX_BLOCKS=%d", maxBlocks)}, c.env...))
	if err != nil {
		return nil, err
	}
	defer d.stop()
	if err := d.createRule(net); err != nil {
		return nil, err
	}
	log.Info("rule created; waiting for every subscriber", "endpoints", c.endpoints)
	warm, err := warmUp(d, pubs, c.endpoints)
	if err != nil {
		return nil, err
	}
	s := startSampler(d, c.sample)
	defer s.stop()
	if err := runFill(c, d, pubs, s, warm, res, log); err != nil {
		return nil, err
	}
	if c.churn > 0 {
		if res.Churn, err = runChurn(c, d, pubs, s, log); err != nil {
			return nil, err
		}
	}
	s.stop()
	if c.series != "" {
		if err := s.writeCSV(c.series); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// warmUp waits until every rank is connected and a probe hash from every
// publisher has reached the inventory, so no fill batch is lost to ZeroMQ's
// slow-joiner window. It returns the blocks the probes left.
func warmUp(d *daemon, pubs *publishers, n int) (int, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := d.alive(); err != nil {
			return 0, err
		}
		m, err := d.scrape()
		if err == nil && int(m.sum("kvgate_kv_subscriber_rank_connected", nil)) == n {
			break
		}
		if time.Now().After(deadline) {
			return 0, errors.New("subscribers not connected after 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	probes := 0
	for time.Now().Before(deadline) {
		m, err := d.scrape()
		if err == nil && m.count("loxilb_pd_kv_blocks", func(v float64) bool { return v >= 1 }) == n {
			return int(m.sum("loxilb_pd_kv_blocks", nil)), nil
		}
		if probes < 100 {
			if err := pubs.all(map[string]any{"op": "warm"}, nil); err != nil {
				return 0, err
			}
			probes++
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0, errors.New("probe hashes did not reach the inventory after 60 s")
}

func runFill(c config, d *daemon, pubs *publishers, s *sampler, warm int, res *result, log *slog.Logger) error {
	target := warm + res.Hashes
	m, err := d.scrape()
	if err != nil {
		return err
	}
	res.Fill.Before = d.memory(m)
	cpu0 := d.cpu()
	log.Info("fill", "hashes", res.Hashes, "endpoints", c.endpoints)
	t0 := time.Now()
	var pubRes []pubResult
	var pubErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pubErr = pubs.all(map[string]any{"op": "fill"}, &pubRes)
	}()
	timeout := max(c.fillTimeoutFloor, 60*time.Second) + time.Duration(res.Hashes/50_000)*time.Second
	blocks, err := waitBlocks(d, target, t0.Add(timeout))
	elapsed := time.Since(t0)
	wg.Wait()
	if err != nil {
		return err
	}
	if pubErr != nil {
		return pubErr
	}
	f := &res.Fill
	f.DaemonCPU = d.cpu() - cpu0
	if m, err := d.scrape(); err == nil {
		f.StoredCounter = int(m.sum("kvgate_kv_subscriber_hashes_total", map[string]string{"event": "stored"}))
	}
	f.Blocks = blocks
	f.Seconds = elapsed.Seconds()
	f.HashesPerSec = float64(res.Hashes) / f.Seconds
	f.DaemonCPUPerHash = f.DaemonCPU / float64(res.Hashes) * 1e9
	for _, p := range pubRes {
		f.PublisherSeconds = max(f.PublisherSeconds, p.Seconds)
		f.PublisherCPU += p.CPU
	}
	f.PublisherRate = float64(res.Hashes) / f.PublisherSeconds
	f.Limit = limitOf(f.Seconds, f.PublisherSeconds)
	if c.settle == 0 {
		c.settle = 2 * time.Second
	}
	time.Sleep(c.settle) // let the receive queues drain and the GC settle
	m, err = d.scrape()
	if err != nil {
		return err
	}
	f.After = d.memory(m)
	f.Peak = s.peak()
	n := float64(res.Hashes)
	f.RSSPerHash = f.After.RSS / n
	f.RSSDeltaPerHash = (f.After.RSS - f.Before.RSS) / n
	f.HWMPerHash = f.After.HWM / n
	f.HeapPerHash = f.After.HeapInuse / n
	f.OffHeapPerHash = (f.After.RSS - f.After.GoSys) / n
	log.Info("fill done", "hashes_per_s", int(f.HashesPerSec), "rss_per_hash", f.RSSPerHash, "limited_by", f.Limit)
	return nil
}

// limitOf names the side that bounded the fill: when the daemon finished
// within 10% of the publishers' own send time, the publishers were the
// bottleneck (their sockets never stayed full); otherwise the daemon was.
func limitOf(endToEnd, publishers float64) string {
	if endToEnd <= publishers*1.1 {
		return "publishers"
	}
	return "daemon"
}

func waitBlocks(d *daemon, target int, deadline time.Time) (int, error) {
	for {
		if err := d.alive(); err != nil {
			return 0, err
		}
		m, err := d.scrape()
		if err == nil {
			if b := int(m.sum("loxilb_pd_kv_blocks", nil)); b >= target {
				return b, nil
			}
		}
		if time.Now().After(deadline) {
			b := 0
			if err == nil {
				b = int(m.sum("loxilb_pd_kv_blocks", nil))
			}
			return b, fmt.Errorf("inventory holds %d of %d blocks at the deadline", b, target)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func runChurn(c config, d *daemon, pubs *publishers, s *sampler, log *slog.Logger) (*churn, error) {
	m0, err := d.scrape()
	if err != nil {
		return nil, err
	}
	applied0 := m0.sum("kvgate_kv_subscriber_hashes_total", nil)
	cpu0 := d.cpu()
	mark := s.mark()
	log.Info("churn", "seconds", c.churn.Seconds(), "target_hashes_per_s", c.churnRate)
	t0 := time.Now()
	var pubRes []pubResult
	if err := pubs.all(map[string]any{"op": "churn", "seconds": c.churn.Seconds(), "rate": c.churnRate / float64(c.endpoints)}, &pubRes); err != nil {
		return nil, err
	}
	sent := 0
	for _, p := range pubRes {
		sent += p.Hashes
	}
	// Wait for the daemon to apply what was sent, bounded so a daemon that
	// falls behind shows as a lower applied rate.
	want := applied0 + float64(sent)
	deadline := time.Now().Add(30 * time.Second)
	var applied float64
	for {
		m, err := d.scrape()
		if err != nil {
			return nil, err
		}
		applied = m.sum("kvgate_kv_subscriber_hashes_total", nil)
		if applied >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(t0).Seconds()
	mEnd, err := d.scrape()
	if err != nil {
		return nil, err
	}
	ch := &churn{Seconds: elapsed, TargetRate: c.churnRate, DaemonCPU: d.cpu() - cpu0,
		Blocks: int(mEnd.sum("loxilb_pd_kv_blocks", nil)), HWM: d.memory(mEnd).HWM}
	ch.PublishedRate = float64(sent) / c.churn.Seconds()
	ch.AppliedRate = (applied - applied0) / elapsed
	ch.Applied = int(applied - applied0)
	ch.Published = sent
	samples := s.since(mark)
	ch.RSSSecondQ, ch.RSSLastQ, ch.HeapLastQ = quarterMedians(samples)
	ch.GrowthBytes = ch.RSSLastQ - ch.RSSSecondQ
	// Flat: the last quarter's median within 2% (at least 8 MiB) of the
	// second quarter's, skipping the first quarter where the table and the
	// Go heap take on the churn's working set.
	ch.Flat = ch.GrowthBytes <= max(0.02*ch.RSSSecondQ, 8<<20)
	log.Info("churn done", "applied_hashes_per_s", int(ch.AppliedRate), "rss_growth_bytes", ch.GrowthBytes, "flat", ch.Flat)
	return ch, nil
}

func quarterMedians(samples []sample) (second, last, heapLast float64) {
	n := len(samples)
	if n < 4 {
		if n == 0 {
			return 0, 0, 0
		}
		return samples[0].rss, samples[n-1].rss, samples[n-1].heap
	}
	pick := func(from, to int, f func(sample) float64) float64 {
		var v []float64
		for _, s := range samples[from:to] {
			v = append(v, f(s))
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	rss := func(s sample) float64 { return s.rss }
	heap := func(s sample) float64 { return s.heap }
	return pick(n/4, n/2, rss), pick(3*n/4, n, rss), pick(3*n/4, n, heap)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	s := string(b)
	if len(s) > 14 {
		s = s[:14]
	}
	return s
}
