// Command routing benchmarks every routing policy side by side on simulated
// vLLM fleets (internal/enginesim): kvgate with each load blend, round-robin,
// least-in-flight, least-load from the engines' metrics, a Go port of the
// SGLang router's cache-aware policy, and an oracle that sees the engines'
// true caches and queues. See docs/routing-benchmark.md.
//
//	go run ./bench/routing -mode quick            # ~5 minutes
//	go run ./bench/routing -mode full &           # ≤ 90 minutes, resumable
//	go run ./bench/routing -report                # tables and plots from the CSV
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/routing/harness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/routing:", err)
		os.Exit(1)
	}
}

func run() error {
	mode := flag.String("mode", "quick", "quick (one load per workload, ~5 min), full (QPS sweep + closed loop, seeds 4-6, ≤ 90 min), tune (SGLang thresholds on the tune profile, seeds 1-3) or point")
	out := flag.String("out", "bench/routing/out", "output directory (gitignored): results CSV and plots")
	policies := flag.String("policies", "", "comma-separated policies (default: all; -mode quick: "+strings.Join(harness.QuickPolicies, ",")+")")
	workloads := flag.String("workloads", strings.Join(harness.Workloads, ","), "comma-separated workloads")
	seeds := flag.String("seeds", "4,5,6", "seeds for -mode full")
	tokDir := flag.String("tokenizer-dir", "pkg/tokenizer/testdata/qwen3", "Qwen3 tokenizer (tokenizer.json, tokenizer_config.json)")
	qps := flag.Float64("qps", 0, "-mode point: open-loop QPS")
	conc := flag.Int("conc", 0, "-mode point: closed-loop clients")
	requests := flag.Int("requests", 0, "requests per point (0: the mode's default)")
	profile := flag.String("profile", "headline", "-mode point: profile (tune or headline)")
	seed := flag.Uint64("seed", 4, "-mode point: seed")
	dry := flag.Bool("dry-run", false, "print how many points the mode has and the time estimate, run nothing")
	report := flag.Bool("report", false, "only write the tables and plots from the CSV")
	traceReqs := flag.Bool("trace", false, "also write every request of every point to <out>/trace/")
	verbose := flag.Bool("v", false, "log engines and gateways to stderr")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	csvPath := filepath.Join(*out, "results-"+*mode+".csv")
	if *report {
		return harness.Report(os.Stdout, csvPath, *out)
	}
	pols, wls := split(*policies), split(*workloads)
	if len(pols) == 0 {
		pols = harness.Policies
		if *mode == "quick" {
			pols = harness.QuickPolicies
		}
	}
	for _, w := range wls {
		if !slices.Contains(harness.Workloads, w) {
			return fmt.Errorf("-workloads: %q is not one of %s", w, strings.Join(harness.Workloads, ", "))
		}
	}
	for _, p := range pols {
		if !slices.Contains(harness.Policies, p) && !strings.HasPrefix(p, "sglang@") {
			return fmt.Errorf("-policies: %q is not one of %s (or sglang@absN-relF-thrF)", p, strings.Join(harness.Policies, ", "))
		}
	}
	var plan harness.Plan
	switch *mode {
	case "quick":
		plan = harness.QuickPlan(pols, wls)
	case "full":
		var ss []uint64
		for _, s := range split(*seeds) {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return fmt.Errorf("-seeds: %q is not a number", s)
			}
			ss = append(ss, v)
		}
		plan = harness.FullPlan(pols, wls, ss)
	case "tune":
		plan = harness.TunePlan()
	case "point":
		prof, ok := harness.Profiles[*profile]
		if !ok {
			return fmt.Errorf("-profile: %q is not tune or headline", *profile)
		}
		if (*qps > 0) == (*conc > 0) {
			return fmt.Errorf("-mode point needs exactly one of -qps and -conc")
		}
		n := *requests
		if n == 0 {
			n = 40
		}
		for _, w := range wls {
			for _, p := range pols {
				plan.Points = append(plan.Points, harness.Point{Profile: prof, Seed: *seed, Workload: w,
					Load: harness.Load{QPS: *qps, Concurrency: *conc}, Policy: p, Shape: harness.DefaultShape(n)})
			}
		}
	default:
		return fmt.Errorf("-mode: %q is not quick, full, tune or point", *mode)
	}
	for i := range plan.Points {
		if *requests > 0 {
			plan.Points[i].Shape.Requests = *requests
		}
		if *traceReqs {
			plan.Points[i].TraceDir = filepath.Join(*out, "trace")
		}
	}
	if *traceReqs {
		if err := os.MkdirAll(filepath.Join(*out, "trace"), 0o755); err != nil {
			return err
		}
	}

	env, err := harness.NewEnv(*tokDir, log)
	if err != nil {
		return err
	}
	defer env.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	prior, err := harness.ReadResults(csvPath)
	if err != nil {
		return err
	}
	finished := map[string]bool{}
	for _, r := range prior {
		finished[r.Key()] = true
	}
	var left time.Duration
	todo := 0
	for _, pt := range plan.Points {
		if !finished[pt.Key()] {
			left += harness.EstimateDuration(pt)
			todo++
		}
	}
	fmt.Fprintf(os.Stderr, "%d points, %d finished earlier, %d to run (about %s); results in %s\n",
		len(plan.Points), len(plan.Points)-todo, todo, left.Round(time.Minute), csvPath)
	if *dry {
		return nil
	}
	started := time.Now()
	done := 0
	for _, pt := range plan.Points {
		if finished[pt.Key()] {
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted after %d points; rerun to resume", done)
		}
		r, err := harness.RunPoint(ctx, env, pt)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted after %d points; rerun to resume", done)
			}
			return fmt.Errorf("point %s: %w", pt.Key(), err)
		}
		if err := harness.AppendResult(csvPath, r); err != nil {
			return err
		}
		done++
		fmt.Fprintf(os.Stderr, "[%d/%d %s] %-10s %s=%-5g %-21s ttft p50 %.3fs p90 %.3fs cached %.1f%% load max/mean %.2f err %d\n",
			done, todo, time.Since(started).Round(time.Second), pt.Workload, pt.Load.Kind(), pt.Load.Value(), pt.Policy,
			r.TTFTp50, r.TTFTp90, 100*r.CachedRatio, r.LoadMaxMean, r.Errors)
	}
	return harness.Report(os.Stdout, csvPath, *out)
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
