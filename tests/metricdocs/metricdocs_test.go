// Package metricdocs_test keeps the metric names in docs/*.md true: every
// kvgate_* and loxilb_* name a page mentions must be a series the daemon
// registers, built as the daemon builds it (gateway.New, plus the AI
// controller's applier series that --ai-controller adds), or be listed
// below as a prefix or as not exported, with the reason. Operators copy
// these names into dashboards and alerts; a name that does not exist is a
// silent, empty panel.
package metricdocs_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/aictrl"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// prefixes are mentions of a family of series rather than one name (a
// `kvctl get metrics --grep` pattern, "the kvgate_kv_parity_* series"):
// each must begin at least one registered name.
var prefixes = map[string]bool{
	"loxilb_pd_kv": true, // kvctl get metrics --grep 'loxilb_pd_kv|…'
}

// notExported are names the docs mention that the daemon does not export
// on purpose, each with where it lives instead.
var notExported = map[string]string{
	"kvgate_prompt_tokens": "a field of the usage audit's log line (docs/parity.md), next to engine_prompt_tokens",
}

// metricName finds kvgate_* and loxilb_* names; link targets are removed
// first, since a heading's anchor (#cost-mode-loxilb_kv_lb_modecost) is not
// a metric.
var (
	metricName = regexp.MustCompile(`\b(?:kvgate|loxilb)_[a-z0-9_]+`)
	linkTarget = regexp.MustCompile(`\]\([^)]*\)`)
)

func TestDocumentedMetricsAreExported(t *testing.T) {
	reg := daemonRegistry(t)
	mentioned := documentedNames(t)
	var names []string
	for n := range mentioned {
		names = append(names, n)
	}
	sort.Strings(names)
	registered := 0
	for _, n := range names {
		where := strings.Join(mentioned[n], ", ")
		switch {
		case strings.HasSuffix(n, "_") || prefixes[n]:
			if !reg.hasPrefix(n, names) {
				t.Errorf("%s (in %s): no registered series begins with it", n, where)
			}
		case notExported[n] != "":
			if reg.has(n) {
				t.Errorf("%s is listed as not exported (%s) but the daemon registers it: drop it from notExported", n, notExported[n])
			}
		case reg.has(n):
			registered++
		default:
			t.Errorf("%s (in %s) is not a series the daemon registers: export it, fix the name, or list it in notExported with the reason", n, where)
		}
	}
	t.Logf("%d names in docs/*.md; %d registered series, %d prefixes, %d listed as not exported", len(names), registered, len(prefixes), len(notExported))
	if registered < 50 {
		t.Fatalf("only %d documented names matched: is the docs scan broken?", registered)
	}
	if reg.has("kvgate_no_such_series_total") {
		t.Fatal("the registry probe reports a name nobody registers: the check is blind")
	}
}

// TestExportedMetricsAreDocumented is the other direction: every name the
// metric packages register is on some docs page (and is registered, so a
// stale string in the source does not count).
func TestExportedMetricsAreDocumented(t *testing.T) {
	reg := daemonRegistry(t)
	mentioned := documentedNames(t)
	sources := []string{"../../pkg/metrics/*.go", "../../pkg/aictrl/metrics.go"}
	quoted := regexp.MustCompile(`"((?:kvgate|loxilb)_[a-z0-9_]+)"`)
	seen := 0
	for _, pattern := range sources {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v", pattern, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range quoted.FindAllStringSubmatch(string(b), -1) {
				n := m[1]
				if !reg.has(n) {
					continue // a label value or a name in a comment-like string
				}
				seen++
				if len(mentioned[n]) == 0 {
					t.Errorf("%s (registered in %s) is on no docs page: add it to docs/api.md's metrics table", n, filepath.Base(f))
				}
			}
		}
	}
	if seen < 50 {
		t.Fatalf("only %d registered names found in the sources: is the scan broken?", seen)
	}
}

// documentedNames maps each metric name in docs/*.md to the pages naming it.
func documentedNames(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("docs/*.md: %v (%d files)", err, len(files))
	}
	out := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := linkTarget.ReplaceAllString(string(b), "]")
		for _, n := range metricName.FindAllString(text, -1) {
			base := filepath.Base(f)
			if !slices.Contains(out[n], base) {
				out[n] = append(out[n], base)
			}
		}
	}
	return out
}

// registry answers whether a name is registered. prometheus.Registry does
// not list its collectors, so each question registers a probe gauge of that
// name: the registry refuses it exactly when a collector already describes
// the name (with other labels or help), and the probe is removed otherwise.
type registry struct{ reg *prometheus.Registry }

func (r *registry) has(name string) bool {
	if r.describes(name) {
		return true
	}
	// A histogram's series are documented as name_bucket, _sum and _count.
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, s); ok && r.describes(base) {
			return true
		}
	}
	return false
}

func (r *registry) describes(name string) bool {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "metricdocs probe " + name})
	if err := r.reg.Register(probe); err != nil {
		var are prometheus.AlreadyRegisteredError
		return !errors.As(err, &are) || are.ExistingCollector != probe
	}
	r.reg.Unregister(probe)
	return false
}

// hasPrefix reports whether a registered name among candidates (the
// documented ones) begins with p.
func (r *registry) hasPrefix(p string, candidates []string) bool {
	for _, n := range candidates {
		if n != p && strings.HasPrefix(n, p) && r.has(n) {
			return true
		}
	}
	return false
}

// daemonRegistry builds the registry as kvgate's main does: gateway.New
// registers every kvgate collector; --ai-controller adds the applier's.
func daemonRegistry(t *testing.T) *registry {
	t.Helper()
	g, err := gateway.New(gateway.Options{Settings: config.DefaultSettings(), TokenizerDir: t.TempDir(), ShutdownGrace: time.Second,
		Datapath: "userspace", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Shutdown)
	if _, err := aictrl.NewMetrics(g.Metrics.Registry); err != nil {
		t.Fatal(err)
	}
	return &registry{reg: g.Metrics.Registry}
}
