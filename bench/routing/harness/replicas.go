package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/selector"
)

// Active-active replicas (docs/replicas.md): policy kvgate-xN runs N
// in-process kvgate replicas with the same rule, as a --rules-file would give
// them (fixed ep_idx, owned by the file), over the same fleet; the client
// spreads its requests over the replicas (Front.URL lists them, Replay
// round-robins). kvgate-x1 is the same path with one replica, the baseline.

// maxReplicas bounds kvgate-xN.
const maxReplicas = 8

// ReplicaFlags are a kvgate-xN policy's variants, as "-"-separated suffixes:
// "local" runs the replicas without the shared load view (each counts its
// own requests only), "hash" turns on cold placement by the prompt's hash
// (LLB_KV_COLD_PLACEMENT=hash), "sel" forces the rule's sel for cold
// requests, for comparison; "decayN" decays the other replicas' part of the
// shared load view with a half-life of N ms; "scrapeN" scrapes the engines'
// load every N ms (LLB_KV_LOAD_SCRAPE_MS) instead of with each 1 s probe;
// "lc" gives the rule sel 4 (least connections) instead of round-robin;
// "mirror" extrapolates the other replicas' part of the view from this
// replica's own change since the scrape (LLB_KV_LOAD_MIRROR=on);
// "holders" sets LLB_KV_RELIEF_TARGET=holders.
type ReplicaFlags struct {
	LocalOnly bool
	LeastConn bool
	Mirror    bool
	Holders   bool
	HalfLife  time.Duration
	Scrape    time.Duration
	// ColdPlacement is LLB_KV_COLD_PLACEMENT; nil keeps kvgate's default.
	ColdPlacement *selector.ColdPlacement
}

// replicaCount reads N and the flags from a kvgate-xN[-flag…] policy name.
func replicaCount(name string) (n int, flags ReplicaFlags, ok bool) {
	s, ok := strings.CutPrefix(name, "kvgate-x")
	if !ok {
		return 0, flags, false
	}
	parts := strings.Split(s, "-")
	n, err := strconv.Atoi(parts[0])
	if err != nil || n < 1 || n > maxReplicas {
		return 0, flags, false
	}
	for _, f := range parts[1:] {
		switch f {
		case "local":
			flags.LocalOnly = true
		case "lc":
			flags.LeastConn = true
		case "mirror":
			flags.Mirror = true
		case "holders":
			flags.Holders = true
		case "hash", "sel":
			p, _ := selector.ParseColdPlacement(f)
			flags.ColdPlacement = &p
		default:
			if !durationFlag(f, "decay", &flags.HalfLife) && !durationFlag(f, "scrape", &flags.Scrape) {
				return 0, flags, false
			}
		}
	}
	return n, flags, true
}

// durationFlag reads "<prefix>N" (N ms, 1..60000) into dst.
func durationFlag(f, prefix string, dst *time.Duration) bool {
	v, ok := strings.CutPrefix(f, prefix)
	ms, err := strconv.Atoi(v)
	if !ok || err != nil || ms < 1 || ms > 60000 {
		return false
	}
	*dst = time.Duration(ms) * time.Millisecond
	return true
}

// replicaRule is the rule every replica loads: probes and engine scrapes
// every second, the interval docs/replicas.md suggests for replicas.
func replicaRule(f *Fleet, host string, port int) (*config.Rule, error) {
	r := &config.Rule{ServiceID: 1, Args: config.ServiceArguments{ExternalIP: host, Port: port, Protocol: "tcp", Mode: config.ModeFullProxy,
		KVExactMode: config.KVModeSinglePool, KVZmqPort: f.ZMQPort, KVBlockSize: 16, KVHashAlgo: config.HashSHA256CBOR,
		ProbeType: config.ProbeHTTP, ProbeReq: config.DefaultProbeHTTPPath, ProbeInterval: 1, ProbeTimeout: 1}}
	for i, e := range f.Engines {
		h, p, err := net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
		if err != nil {
			return nil, fmt.Errorf("engine URL %q: %w", e.URL(), err)
		}
		pn, _ := strconv.Atoi(p)
		r.Endpoints = append(r.Endpoints, config.Endpoint{Idx: i, IP: h, TargetPort: pn, Weight: 1})
	}
	return r, nil
}

// StartKVGateReplicas starts n kvgate replicas, each on its own port of the
// fleet's front host, and waits until every one follows every engine.
func StartKVGateReplicas(ctx context.Context, env *Env, f *Fleet, n int, flags ReplicaFlags) (*Front, error) {
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	if flags.ColdPlacement != nil {
		settings.ColdPlacement = *flags.ColdPlacement
	}
	settings.LoadScrapeInterval = flags.Scrape
	settings.LoadMirror = flags.Mirror
	if flags.Holders {
		settings.ReliefTarget = selector.ReliefToHolders
	}
	host := f.Host + "1"
	var gws []*gateway.Gateway
	var urls []string
	stop := func() {
		for _, g := range gws {
			g.Shutdown()
		}
	}
	for i := range n {
		port, err := testnet.FreePort(host)
		if err != nil {
			stop()
			return nil, err
		}
		rule, err := replicaRule(f, host, port)
		if err != nil {
			stop()
			return nil, err
		}
		if flags.LeastConn {
			rule.Args.Sel = selector.SelLeastConn
		}
		g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: env.StagingDir, Datapath: "userspace", DecisionHeader: true,
			Logger: env.Log, ShutdownGrace: 2 * time.Second, LocalLoadOnly: flags.LocalOnly, SharedLoadHalfLife: flags.HalfLife,
			CursorStart: rand.New(rand.NewPCG(uint64(i), 0x5eed)).Uint64()}) // as cmd/kvgate's random start, reproducible
		if err != nil {
			stop()
			return nil, fmt.Errorf("kvgate replica %d: %w", i, err)
		}
		gws = append(gws, g)
		if _, err := g.API.ReconcileFile("bench-rules.yaml", []api.FileRule{{Rule: rule, Where: "rules[0]", ServiceIDGiven: true}}); err != nil {
			stop()
			return nil, fmt.Errorf("kvgate replica %d rule: %w", i, err)
		}
		urls = append(urls, fmt.Sprintf("http://%s:%d", host, port))
	}
	for i, g := range gws {
		if err := waitSubscribers(ctx, g, 1, len(f.Engines)); err != nil {
			stop()
			return nil, errors.Join(fmt.Errorf("kvgate replica %d", i), err)
		}
	}
	return &Front{URL: strings.Join(urls, ","), close: stop}, nil
}

// frontBases splits a Front URL that lists several replicas.
func frontBases(base string) []string { return strings.Split(base, ",") }
