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

// options are the command's flags.
type options struct {
	mode, out, policies, workloads, seeds, tokDir, profile string
	qps                                                    float64
	conc, requests                                         int
	seed                                                   uint64
	dry, report, trace, verbose                            bool
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.mode, "mode", "quick", "quick (one load per workload, ~5 min), full (QPS sweep + closed loop, seeds 4-6, ≤ 90 min), tune (SGLang thresholds on the tune profile, seeds 1-3) or point")
	flag.StringVar(&o.out, "out", "bench/routing/out", "output directory (gitignored): results CSV and plots")
	flag.StringVar(&o.policies, "policies", "", "comma-separated policies (default: all; -mode quick: "+strings.Join(harness.QuickPolicies(), ",")+"; -mode full: all but kvgate-noprov)")
	flag.StringVar(&o.workloads, "workloads", strings.Join(harness.Workloads(), ","), "comma-separated workloads")
	flag.StringVar(&o.seeds, "seeds", "4,5,6", "seeds for -mode full")
	flag.StringVar(&o.tokDir, "tokenizer-dir", "pkg/tokenizer/testdata/qwen3", "Qwen3 tokenizer (tokenizer.json, tokenizer_config.json)")
	flag.Float64Var(&o.qps, "qps", 0, "-mode point: open-loop QPS")
	flag.IntVar(&o.conc, "conc", 0, "-mode point: closed-loop clients")
	flag.IntVar(&o.requests, "requests", 0, "requests per point (0: the mode's default)")
	flag.StringVar(&o.profile, "profile", "headline", "-mode point: profile (tune or headline)")
	flag.Uint64Var(&o.seed, "seed", 4, "-mode point: seed")
	flag.BoolVar(&o.dry, "dry-run", false, "print how many points the mode has and the time estimate, run nothing")
	flag.BoolVar(&o.report, "report", false, "only write the tables and plots from the CSV")
	flag.BoolVar(&o.trace, "trace", false, "also write every request of every point to <out>/trace/")
	flag.BoolVar(&o.verbose, "v", false, "log engines and gateways to stderr")
	flag.Parse()
	return o
}

func run() error {
	o := parseFlags()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if o.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	csvPath := filepath.Join(o.out, "results-"+o.mode+".csv")
	if o.report {
		return harness.Report(os.Stdout, csvPath, o.out)
	}
	pols, wls, err := selection(o)
	if err != nil {
		return err
	}
	plan, err := buildPlan(o, pols, wls)
	if err != nil {
		return err
	}
	if o.trace {
		if err := os.MkdirAll(filepath.Join(o.out, "trace"), 0o755); err != nil {
			return err
		}
	}

	env, err := harness.NewEnv(o.tokDir, log)
	if err != nil {
		return err
	}
	defer env.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runPlan(ctx, env, plan, csvPath, o)
}

// selection is the policies and workloads to run: the flags' lists, checked,
// or the mode's default policies.
func selection(o options) (pols, wls []string, err error) {
	pols, wls = split(o.policies), split(o.workloads)
	if len(pols) == 0 {
		pols = harness.Policies()
		switch o.mode {
		case "quick":
			pols = harness.QuickPolicies()
		case "full":
			pols = harness.FullPolicies()
		}
	}
	all := harness.Workloads()
	for _, w := range wls {
		if !slices.Contains(all, w) {
			return nil, nil, fmt.Errorf("-workloads: %q is not one of %s", w, strings.Join(all, ", "))
		}
	}
	known := harness.Policies()
	for _, p := range pols {
		base, _, tuned := strings.Cut(p, "@")
		if !slices.Contains(known, p) && !strings.HasPrefix(p, "sglang@") && !strings.HasPrefix(p, "kvgate-x") &&
			!(tuned && slices.Contains(known, base) && strings.HasPrefix(p, "kvgate")) {
			return nil, nil, fmt.Errorf("-policies: %q is not one of %s (or sglang@absN-relF-thrF, a kvgate policy with @mlfN-provwN, or kvgate-xN: N replicas)", p, strings.Join(known, ", "))
		}
	}
	return pols, wls, nil
}

// buildPlan is the mode's plan with -requests and -trace applied.
func buildPlan(o options, pols, wls []string) (harness.Plan, error) {
	var plan harness.Plan
	switch o.mode {
	case "quick":
		plan = harness.QuickPlan(pols, wls)
	case "full":
		var ss []uint64
		for _, s := range split(o.seeds) {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return plan, fmt.Errorf("-seeds: %q is not a number", s)
			}
			ss = append(ss, v)
		}
		plan = harness.FullPlan(pols, wls, ss)
	case "tune":
		plan = harness.TunePlan()
	case "point":
		var err error
		if plan, err = pointPlan(o, pols, wls); err != nil {
			return plan, err
		}
	default:
		return plan, fmt.Errorf("-mode: %q is not quick, full, tune or point", o.mode)
	}
	for i := range plan.Points {
		if o.requests > 0 {
			plan.Points[i].Shape.Requests = o.requests
		}
		if o.trace {
			plan.Points[i].TraceDir = filepath.Join(o.out, "trace")
		}
	}
	return plan, nil
}

// pointPlan is -mode point: one load on one profile and seed, for every
// selected workload and policy.
func pointPlan(o options, pols, wls []string) (harness.Plan, error) {
	var plan harness.Plan
	prof, ok := harness.Profiles()[o.profile]
	if !ok {
		return plan, fmt.Errorf("-profile: %q is not tune or headline", o.profile)
	}
	if (o.qps > 0) == (o.conc > 0) {
		return plan, fmt.Errorf("-mode point needs exactly one of -qps and -conc")
	}
	n := o.requests
	if n == 0 {
		n = 40
	}
	for _, w := range wls {
		for _, p := range pols {
			plan.Points = append(plan.Points, harness.Point{Profile: prof, Seed: o.seed, Workload: w,
				Load: harness.Load{QPS: o.qps, Concurrency: o.conc}, Policy: p, Shape: harness.DefaultShape(n)})
		}
	}
	return plan, nil
}

// runPlan runs the plan's points not already in the CSV, appending each
// result as it finishes so an interrupted run resumes, then writes the report.
func runPlan(ctx context.Context, env *harness.Env, plan harness.Plan, csvPath string, o options) error {
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
	if o.dry {
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
	return harness.Report(os.Stdout, csvPath, o.out)
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
