package harness

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// agg is the median over seeds of one (workload, load, policy).
type agg struct {
	workload, policy string
	load             Load
	seeds            int
	m                Result // medians, field by field
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// aggregate groups results by (profile, workload, load, policy) and takes
// medians over seeds.
func aggregate(rs []Result) []agg {
	type key struct {
		prof, w, kind, pol string
		load               float64
	}
	groups := map[key][]Result{}
	var keys []key
	for _, r := range rs {
		k := key{r.Profile.Name, r.Workload, r.Load.Kind(), r.Policy, r.Load.Value()}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []agg
	for _, k := range keys {
		g := groups[k]
		col := func(f func(Result) float64) float64 {
			v := make([]float64, len(g))
			for i, r := range g {
				v[i] = f(r)
			}
			return median(v)
		}
		m := Result{Point: g[0].Point}
		m.Requests = int(col(func(r Result) float64 { return float64(r.Requests) }))
		m.Errors = int(math.Round(col(func(r Result) float64 { return float64(r.Errors) })))
		m.TTFTp50 = col(func(r Result) float64 { return r.TTFTp50 })
		m.TTFTp90 = col(func(r Result) float64 { return r.TTFTp90 })
		m.TTFTp99 = col(func(r Result) float64 { return r.TTFTp99 })
		m.ITLp50 = col(func(r Result) float64 { return r.ITLp50 })
		m.E2Ep90 = col(func(r Result) float64 { return r.E2Ep90 })
		m.OutTokPerS = col(func(r Result) float64 { return r.OutTokPerS })
		m.CachedTok = int(col(func(r Result) float64 { return float64(r.CachedTok) }))
		m.PromptTokens = int(col(func(r Result) float64 { return float64(r.PromptTokens) }))
		m.CachedRatio = col(func(r Result) float64 { return r.CachedRatio })
		m.LoadMaxMean = col(func(r Result) float64 { return r.LoadMaxMean })
		m.ReqMaxMean = col(func(r Result) float64 { return r.ReqMaxMean })
		out = append(out, agg{workload: k.w, policy: k.pol, load: g[0].Load, seeds: len(g), m: m})
	}
	wls, pols := Workloads(), Policies()
	order := func(list []string, s string) int {
		if i := slices.Index(list, s); i >= 0 {
			return i
		}
		return len(list)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.workload != b.workload {
			return order(wls, a.workload) < order(wls, b.workload)
		}
		if a.load.Kind() != b.load.Kind() {
			return a.load.Kind() > b.load.Kind() // qps before conc
		}
		if a.load.Value() != b.load.Value() {
			return a.load.Value() < b.load.Value()
		}
		return order(pols, a.policy) < order(pols, b.policy)
	})
	return out
}

// oracleCached maps (workload, load) to the oracle's cached tokens.
func oracleCached(as []agg) map[string]float64 {
	m := map[string]float64{}
	for _, a := range as {
		if a.policy == "oracle" {
			m[a.workload+"|"+a.load.Kind()+fmt.Sprint(a.load.Value())] = float64(a.m.CachedTok)
		}
	}
	return m
}

// Report writes the Markdown tables and goal checks for the CSV at path and
// the plots into dir.
func Report(w io.Writer, path, dir string) error {
	rs, err := ReadResults(path)
	if err != nil {
		return err
	}
	if len(rs) == 0 {
		return fmt.Errorf("report: no results in %s", path)
	}
	as := aggregate(rs)
	oc := oracleCached(as)
	cur := ""
	for _, a := range as {
		if a.workload != cur {
			cur = a.workload
			fmt.Fprintf(w, "\n#### %s\n\n", cur)
			fmt.Fprintln(w, "| load | policy | seeds | TTFT p50 | p90 | p99 | ITL p50 | E2E p90 | out tok/s | cached | of oracle | load max/mean | errors |")
			fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		}
		ofOracle := "–"
		if o := oc[a.workload+"|"+a.load.Kind()+fmt.Sprint(a.load.Value())]; o > 0 {
			ofOracle = fmt.Sprintf("%.0f%%", 100*float64(a.m.CachedTok)/o)
		}
		fmt.Fprintf(w, "| %s %g | %s | %d | %s | %s | %s | %s | %s | %.0f | %.1f%% | %s | %.2f | %d/%d |\n",
			a.load.Kind(), a.load.Value(), a.policy, a.seeds, secs(a.m.TTFTp50), secs(a.m.TTFTp90), secs(a.m.TTFTp99),
			secs(a.m.ITLp50), secs(a.m.E2Ep90), a.m.OutTokPerS, 100*a.m.CachedRatio, ofOracle, a.m.LoadMaxMean, a.m.Errors, a.m.Requests)
	}
	fmt.Fprintln(w)
	Goals(w, as)
	return Plots(as, dir)
}

func secs(v float64) string {
	if v < 1 {
		return fmt.Sprintf("%.0f ms", v*1000)
	}
	return fmt.Sprintf("%.2f s", v)
}

// Goals checks the targets of docs/routing-benchmark.md against the medians.
func Goals(w io.Writer, as []agg) {
	g := goals(as)
	fmt.Fprintln(w, "| goal | figure | verdict |")
	fmt.Fprintln(w, "|---|---|---|")
	g.capacity(w)
	g.herding(w)
	g.nosharing(w)
	g.noneBeatsKVGate(w)
}

// goals looks up the medians the goal rows compare.
type goals []agg

func (g goals) get(wl string, l Load, pol string) (Result, bool) {
	for _, a := range g {
		if a.workload == wl && a.load == l && a.policy == pol {
			return a.m, true
		}
	}
	return Result{}, false
}

// loads lists wl's open-loop loads in the order they appear.
func (g goals) loads(wl string) []Load {
	var out []Load
	for _, a := range g {
		if a.workload == wl && a.load.Kind() == "qps" && !slices.Contains(out, a.load) {
			out = append(out, a.load)
		}
	}
	return out
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a / b
}

// capacity compares the policies at the knee: the highest QPS where
// round-robin's TTFT p90 < 5 s.
func (g goals) capacity(w io.Writer) {
	var knee Load
	for _, l := range g.loads("capacity") {
		if rr, ok := g.get("capacity", l, "round-robin"); ok && rr.TTFTp90 < 5 {
			knee = l
		}
	}
	if knee.QPS <= 0 {
		fmt.Fprintln(w, "| capacity knee | no capacity QPS point where round-robin's TTFT p90 < 5 s | – |")
		return
	}
	kv, _ := g.get("capacity", knee, "kvgate")
	for _, c := range []struct {
		pol   string
		bound float64
	}{{"round-robin", 0.2}, {"sglang", 0.5}, {"sglang-scaled", 0.5}, {"oracle", 1.15}} {
		if o, ok := g.get("capacity", knee, c.pol); ok {
			r := ratio(kv.TTFTp90, o.TTFTp90)
			fmt.Fprintf(w, "| capacity @ knee %g QPS: kvgate TTFT p90 ≤ %.2f× %s | %s vs %s = %.2f× | %s |\n",
				knee.QPS, c.bound, c.pol, secs(kv.TTFTp90), secs(o.TTFTp90), r, verdict(r <= c.bound))
		}
	}
	if o, ok := g.get("capacity", knee, "oracle"); ok && o.CachedTok > 0 {
		r := float64(kv.CachedTok) / float64(o.CachedTok)
		fmt.Fprintf(w, "| capacity @ knee: kvgate cached tokens ≥ 98%% of the oracle's | %d vs %d = %.1f%% | %s |\n", kv.CachedTok, o.CachedTok, 100*r, verdict(r >= 0.98))
	}
}

// herding compares kvgate with the best policy at each load and checks its
// load spread.
func (g goals) herding(w io.Writer) {
	for _, l := range g.loads("herding") {
		kv, ok := g.get("herding", l, "kvgate")
		if !ok {
			continue
		}
		best, bestPol := math.Inf(1), ""
		for _, a := range g {
			if a.workload == "herding" && a.load == l && a.m.TTFTp90 < best {
				best, bestPol = a.m.TTFTp90, a.policy
			}
		}
		r := ratio(kv.TTFTp90, best)
		fmt.Fprintf(w, "| herding @ %g QPS: TTFT p90 ≤ 1.1× the best (%s) | %s vs %s = %.2f× | %s |\n", l.QPS, bestPol, secs(kv.TTFTp90), secs(best), r, verdict(r <= 1.1))
		fmt.Fprintf(w, "| herding @ %g QPS: max/mean engine load ≤ 1.5 | %.2f | %s |\n", l.QPS, kv.LoadMaxMean, verdict(kv.LoadMaxMean <= 1.5))
	}
}

func (g goals) nosharing(w io.Writer) {
	for _, l := range g.loads("nosharing") {
		kv, ok1 := g.get("nosharing", l, "kvgate")
		ll, ok2 := g.get("nosharing", l, "least-load")
		if ok1 && ok2 {
			r := ratio(kv.TTFTp90, ll.TTFTp90)
			fmt.Fprintf(w, "| nosharing @ %g QPS: TTFT p90 ≤ 1.05× least-load | %s vs %s = %.2f× | %s |\n", l.QPS, secs(kv.TTFTp90), secs(ll.TTFTp90), r, verdict(r <= 1.05))
		}
	}
}

// noneBeatsKVGate checks that no workload and load has a non-oracle policy
// beating kvgate's TTFT p90 by more than 10%.
func (g goals) noneBeatsKVGate(w io.Writer) {
	var worst []string
	for _, a := range g {
		if a.policy == "kvgate" || a.policy == "oracle" {
			continue
		}
		kv, ok := g.get(a.workload, a.load, "kvgate")
		if ok && a.m.TTFTp90 > 0 && kv.TTFTp90 > 1.1*a.m.TTFTp90 {
			worst = append(worst, fmt.Sprintf("%s %s %g: %s %s vs kvgate %s", a.workload, a.load.Kind(), a.load.Value(), a.policy, secs(a.m.TTFTp90), secs(kv.TTFTp90)))
		}
	}
	fig := "none"
	if len(worst) > 0 {
		if len(worst) > 6 {
			worst = append(worst[:6], fmt.Sprintf("… %d more", len(worst)-6))
		}
		fig = strings.Join(worst, "; ")
	}
	fmt.Fprintf(w, "| no other policy (oracle excepted) beats kvgate's TTFT p90 by > 10%% | %s | %s |\n", fig, verdict(len(worst) == 0))
}

// plotPath names a plot file in dir.
func plotPath(dir, name string) string { return filepath.Join(dir, name) }
