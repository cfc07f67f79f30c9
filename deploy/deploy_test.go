package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/metrics"
)

// ---------------------------------------------------------------------------
// The metric registry: names, kinds and label names of every kvgate series.

type metricInfo struct {
	histogram bool
	labels    map[string]bool
}

// registry returns every metric family pkg/metrics registers, with its label
// names. Vectors export nothing until a label set is used, so the collectors
// in Metrics' exported fields are asked to Describe themselves; Gather adds
// the rest (the spliced-bytes collector, the Go and process collectors).
func registry(t *testing.T) map[string]metricInfo {
	t.Helper()
	m := metrics.New(metrics.Options{Version: "test"})
	out := map[string]metricInfo{}
	descName := regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels := regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !v.Type().Field(i).IsExported() || !f.CanInterface() {
			continue
		}
		c, ok := f.Interface().(prometheus.Collector)
		if !ok || f.IsNil() {
			continue
		}
		_, isHist := f.Interface().(*prometheus.HistogramVec)
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			s := d.String()
			name := descName.FindStringSubmatch(s)
			labels := descLabels.FindStringSubmatch(s)
			if name == nil || labels == nil {
				t.Fatalf("cannot read the Desc %s", s)
			}
			info := metricInfo{histogram: isHist, labels: map[string]bool{}}
			for _, l := range strings.Split(labels[1], ",") {
				if l = strings.TrimSpace(l); l != "" {
					info.labels[l] = true
				}
			}
			out[name[1]] = info
		}
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range families {
		if _, ok := out[mf.GetName()]; ok {
			continue
		}
		info := metricInfo{histogram: mf.GetType().String() == "HISTOGRAM", labels: map[string]bool{}}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				info.labels[lp.GetName()] = true
			}
		}
		out[mf.GetName()] = info
	}
	for _, want := range []string{"loxilb_pd_kv_tier15_hits_total", "kvgate_spliced_bytes_total", "loxilb_proxy_http_ttfb_seconds"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("registry lacks %s: the reflection over pkg/metrics is broken", want)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// A small PromQL reader: enough to find every metric name, label matcher and
// grouping label of an expression, so that a renamed metric or label breaks
// this test instead of a dashboard in production.

// promqlWords are the functions, aggregators and keywords the files may use.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "topk": true, "bottomk": true,
	"quantile": true, "stddev": true, "group": true, "count_values": true,
	"rate": true, "irate": true, "increase": true, "delta": true, "idelta": true, "deriv": true,
	"changes": true, "resets": true, "histogram_quantile": true, "clamp_min": true, "clamp_max": true,
	"abs": true, "absent": true, "absent_over_time": true, "vector": true, "scalar": true, "time": true,
	"max_over_time": true, "min_over_time": true, "avg_over_time": true, "sum_over_time": true,
	"count_over_time": true, "last_over_time": true, "label_replace": true, "sort": true, "sort_desc": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"e": true, "inf": true, "nan": true,
}

// syntheticSeries are series Prometheus itself makes for every target.
var syntheticSeries = map[string]metricInfo{"up": {labels: map[string]bool{}}}

// targetLabels are attached by the scrape (or by the PodMonitor's relabelling).
var targetLabels = []string{"instance", "job", "namespace", "pod", "node", "container"}

var (
	reGrafanaVar  = regexp.MustCompile(`\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*`)
	reSelector    = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	reMatcher     = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"`)
	reClause      = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	reString      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	reBraces      = regexp.MustCompile(`\{[^}]*\}`)
	reRange       = regexp.MustCompile(`\[[^\]]*\]`)
	reNumber      = regexp.MustCompile(`\b[0-9][0-9.eE+\-]*\b`)
	reIdent       = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	reLabelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
)

// lookup resolves a series name used in a query: a histogram is queried
// through its _bucket, _sum or _count series, never bare.
func lookup(reg map[string]metricInfo, name string) (metricInfo, string, error) {
	if info, ok := syntheticSeries[name]; ok {
		return info, name, nil
	}
	if info, ok := reg[name]; ok {
		if info.histogram {
			return info, name, fmt.Errorf("%s is a histogram: query %s_bucket, _sum or _count", name, name)
		}
		return info, name, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if info, ok := reg[base]; ok && info.histogram {
			labels := map[string]bool{}
			for l := range info.labels {
				labels[l] = true
			}
			if suffix == "_bucket" {
				labels["le"] = true
			}
			return metricInfo{histogram: true, labels: labels}, base, nil
		}
	}
	return metricInfo{}, "", fmt.Errorf("metric %q is not registered by pkg/metrics", name)
}

// checkPromQL returns the problems of one expression and the label names its
// result may carry (for legend and annotation templates).
func checkPromQL(reg map[string]metricInfo, expr string) (problems []string, resultLabels map[string]bool, used []string) {
	e := reGrafanaVar.ReplaceAllString(expr, "VAR")
	resultLabels = map[string]bool{}
	for _, l := range targetLabels {
		resultLabels[l] = true
	}
	// Selectors with label matchers.
	for _, m := range reSelector.FindAllStringSubmatch(e, -1) {
		if promqlWords[m[1]] {
			continue
		}
		info, base, err := lookup(reg, m[1])
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		used = append(used, base)
		for _, mm := range reMatcher.FindAllStringSubmatch(m[2], -1) {
			if !info.labels[mm[1]] && !slices.Contains(targetLabels, mm[1]) {
				problems = append(problems, fmt.Sprintf("%s has no label %q (labels: %s)", m[1], mm[1], keys(info.labels)))
			}
		}
	}
	// Every bare identifier left is a metric or a PromQL word.
	clauses := reClause.FindAllStringSubmatch(e, -1)
	rest := reClause.ReplaceAllString(e, " $1 ")
	rest = reString.ReplaceAllString(rest, " ")
	rest = reBraces.ReplaceAllString(rest, " ")
	rest = reRange.ReplaceAllString(rest, " ")
	rest = reNumber.ReplaceAllString(rest, " ")
	inExpr := map[string]bool{}
	for _, id := range reIdent.FindAllString(rest, -1) {
		if promqlWords[id] || id == "VAR" {
			continue
		}
		info, base, err := lookup(reg, id)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		used = append(used, base)
		for l := range info.labels {
			inExpr[l] = true
			resultLabels[l] = true
		}
	}
	// Grouping and matching labels must exist on some series of the expression.
	for _, c := range clauses {
		for _, l := range strings.Split(c[2], ",") {
			l = strings.TrimSpace(l)
			if l == "" || inExpr[l] || slices.Contains(targetLabels, l) {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s (%s): no series of the expression has label %q", c[1], c[2], l))
		}
	}
	if len(used) == 0 {
		problems = append(problems, "no metric in the expression")
	}
	for i := range problems {
		problems[i] = fmt.Sprintf("%s\n    in: %s", problems[i], strings.TrimSpace(expr))
	}
	return problems, resultLabels, used
}

func keys(m map[string]bool) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

var reTemplateLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// TestPromQLReader makes sure the reader used below catches the mistakes it
// exists for.
func TestPromQLReader(t *testing.T) {
	reg := registry(t)
	for _, tc := range []struct {
		expr string
		ok   bool
	}{
		{`sum by (ep_idx) (rate(loxilb_pd_kv_tier15_hits_total{service=~"$service"}[$__rate_interval]))`, true},
		{`histogram_quantile(0.99, sum by (le, stage) (rate(kvgate_decision_stage_seconds_bucket[5m])))`, true},
		{`loxilb_kv_subscriber_connected{instance=~"$instance"} == 0`, true},
		{`up{job="kvgate"} == 0`, true},
		{`sum(rate(loxilb_pd_kv_tier15_hit_total[5m]))`, false},                      // misspelt name
		{`sum by (ep_idx) (rate(loxilb_pd_kv_tier15_fallthrough_total[5m]))`, false}, // label not on the metric
		{`loxilb_pd_kv_zero_hit_watchdog_total{service="1"}`, false},                 // it is service_id
		{`histogram_quantile(0.9, rate(loxilb_proxy_http_ttfb_seconds[5m]))`, false}, // bare histogram
		{`rate(kvgate_requests_total_bucket[5m])`, false},                            // not a histogram
		{`sum by (reason) (rate(loxilb_pd_kv_tier15_miss_reason_total{reason="no_worker"}[5m]))`, true},
	} {
		problems, _, _ := checkPromQL(reg, tc.expr)
		if (len(problems) == 0) != tc.ok {
			t.Errorf("%s: ok=%v, want %v; problems: %v", tc.expr, len(problems) == 0, tc.ok, problems)
		}
	}
}

// ---------------------------------------------------------------------------
// Grafana dashboard.

type grafanaPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDashboard struct {
	UID        string         `json:"uid"`
	Title      string         `json:"title"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/kvgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/kvgate.json: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		t.Fatalf("grafana/kvgate.json: trailing data after the dashboard")
	}
	return d
}

func TestDashboardMetricsExist(t *testing.T) {
	reg := registry(t)
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title")
	}
	var all []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	used := map[string]bool{}
	titles := map[string]bool{}
	for _, p := range all {
		if p.Type == "row" {
			continue
		}
		if titles[p.Title] {
			t.Errorf("two panels titled %q", p.Title)
		}
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			problems, labels, names := checkPromQL(reg, tg.Expr)
			for _, pr := range problems {
				t.Errorf("panel %q: %s", p.Title, pr)
			}
			for _, n := range names {
				used[n] = true
			}
			for _, m := range reTemplateLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
				if !labels[m[1]] {
					t.Errorf("panel %q: legend {{%s}} is not a label of %s", p.Title, m[1], tg.Expr)
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		var obj struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Errorf("variable %s: query is neither a string nor {query}: %v", v.Name, err)
				continue
			}
			q = obj.Query
		}
		m := reLabelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: want label_values(series, label), got %q", v.Name, q)
			continue
		}
		problems, labels, _ := checkPromQL(reg, m[1])
		for _, pr := range problems {
			t.Errorf("variable %s: %s", v.Name, pr)
		}
		if !labels[m[2]] {
			t.Errorf("variable %s: %s has no label %q", v.Name, m[1], m[2])
		}
	}
	// The panels the deployment promises (docs/deploy.md).
	for _, want := range []string{
		"loxilb_pd_kv_tier15_hits_total", "loxilb_pd_kv_tier15_miss_reason_total", "loxilb_pd_kv_tier15_fallthrough_total",
		"loxilb_pd_kv_tier15_spills_total", "loxilb_pd_kv_tier15_cold_seeds_total", "loxilb_pd_kv_zero_hit_watchdog_total",
		"loxilb_pd_kv_blocks", "loxilb_kv_subscriber_connected", "loxilb_kv_subscriber_reconnect_total",
		"loxilb_kv_subscriber_recv_error_total", "kvgate_kv_subscriber_gaps_total", "kvgate_kv_subscriber_replays_total",
		"loxilb_proxy_http_ttfb_seconds", "kvgate_requests_total", "kvgate_request_duration_seconds",
		"kvgate_decision_stage_seconds", "loxilb_pd_fallback_to_normal_total", "loxilb_pd_admission_shed_total",
		"kvgate_pd_timeouts_total", "kvgate_datapath_info", "kvgate_spliced_bytes_total",
	} {
		if !used[want] {
			t.Errorf("the dashboard has no panel over %s", want)
		}
	}
}

// ---------------------------------------------------------------------------
// Prometheus alert rules.

type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var reAnnotationLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

func TestAlertRules(t *testing.T) {
	reg := registry(t)
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	names := map[string]bool{}
	used := map[string]bool{}
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || names[r.Alert] {
				t.Errorf("group %s: alert name %q empty or repeated", g.Name, r.Alert)
			}
			names[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs summary and description annotations", r.Alert)
			}
			problems, labels, ns := checkPromQL(reg, r.Expr)
			for _, pr := range problems {
				t.Errorf("%s: %s", r.Alert, pr)
			}
			for _, n := range ns {
				used[n] = true
			}
			for _, a := range r.Annotations {
				for _, m := range reAnnotationLabel.FindAllStringSubmatch(a, -1) {
					if !labels[m[1]] {
						t.Errorf("%s: annotation uses $labels.%s, which %s does not carry", r.Alert, m[1], r.Expr)
					}
				}
			}
		}
	}
	// The spec's silent failures must each have an alert.
	for _, want := range []string{
		"loxilb_pd_kv_zero_hit_watchdog_total",  // parity: watchdog
		"loxilb_pd_kv_tier15_hits_total",        // parity: hits flat ...
		"loxilb_pd_kv_blocks",                   // ... while the inventory is non-empty ...
		"loxilb_pd_kv_tier15_miss_reason_total", // ... and no_worker rises
		"loxilb_kv_subscriber_connected",        // subscriber disconnected
		"loxilb_pd_kv_tier15_fallthrough_total", // fallthrough ratio
	} {
		if !used[want] {
			t.Errorf("no alert uses %s", want)
		}
	}
}

// ---------------------------------------------------------------------------
// YAML files and the Kubernetes objects.

// yamlDocs decodes every document of a YAML file into generic values.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []map[string]any
	for i := 0; ; i++ {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	return docs
}

func TestYAMLFilesParse(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 6 {
		t.Fatalf("found only %d YAML files: %v", len(files), files)
	}
	for _, f := range files {
		docs := yamlDocs(t, f)
		if len(docs) == 0 {
			t.Errorf("%s: no document", f)
		}
		if !strings.HasPrefix(f, "kubernetes"+string(filepath.Separator)) {
			continue
		}
		for i, d := range docs {
			md, _ := d["metadata"].(map[string]any)
			if d["apiVersion"] == nil || d["kind"] == nil || md == nil || md["name"] == nil {
				t.Errorf("%s: document %d lacks apiVersion, kind or metadata.name", f, i)
			}
		}
	}
}

// object returns the one object of that kind and name in a file.
func object(t *testing.T, path, kind, name string) map[string]any {
	t.Helper()
	for _, d := range yamlDocs(t, path) {
		md, _ := d["metadata"].(map[string]any)
		if d["kind"] == kind && md != nil && md["name"] == name {
			return d
		}
	}
	t.Fatalf("%s: no %s %s", path, kind, name)
	return nil
}

// get walks a decoded YAML value by map keys and list indices.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func container(t *testing.T, podSpec any, name string) map[string]any {
	t.Helper()
	cs, _ := get(podSpec, "containers").([]any)
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

func containerEnv(c map[string]any) map[string]string {
	env := map[string]string{}
	list, _ := c["env"].([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		name, _ := m["name"].(string)
		value, _ := m["value"].(string)
		env[name] = value
	}
	return env
}

func kvgatePod(t *testing.T) (podSpec any, kvgate map[string]any) {
	ds := object(t, "kubernetes/base/daemonset.yaml", "DaemonSet", "kvgate")
	podSpec = get(ds, "spec", "template", "spec")
	return podSpec, container(t, podSpec, "kvgate")
}

// documentedVariables are the variables of docs/configuration.md's tables
// (the prose also names reference variables kvgate does not read: those are
// not in a table).
func documentedVariables(t *testing.T) map[string]bool {
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\|\\s*`([A-Z][A-Z0-9_]+)`\\s*\\|")
	vars := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		vars[m[1]] = true
	}
	if len(vars) < 20 {
		t.Fatalf("docs/configuration.md: found only %d variables in its tables", len(vars))
	}
	return vars
}

func TestDaemonSetEnvironment(t *testing.T) {
	_, kvgate := kvgatePod(t)
	env := containerEnv(kvgate)
	documented := documentedVariables(t)
	for name := range env {
		if !documented[name] {
			t.Errorf("DaemonSet sets %s, which docs/configuration.md does not list", name)
		}
	}
	// Every current variable is set explicitly (docs/configuration.md: reproducible runs);
	// the legacy switch is read only when LOXILB_KV_LB_MODE is unset.
	for name := range documented {
		if _, ok := env[name]; !ok && name != "LOXILB_KV_UNIFIED_MODE" {
			t.Errorf("docs/configuration.md lists %s but the DaemonSet does not set it", name)
		}
	}
	// The values parse, and are the defaults except the seed, which the
	// parity triad fixes at "0".
	got, err := config.SettingsFromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("DaemonSet environment: %v", err)
	}
	want := config.DefaultSettings()
	want.NoneHashSeed, want.NoneHashSeedSet = "0", true
	if !reflect.DeepEqual(got, want) {
		t.Errorf("DaemonSet environment is not the documented defaults:\n got %+v\nwant %+v", got, want)
	}
}

// kvgateFlags reads the flag names cmd/kvgate defines (fl.StringVar(&x,
// "name", …) and friends) from its source: package main cannot be imported.
func kvgateFlags(t *testing.T) map[string]bool {
	fset := token.NewFileSet()
	files, err := filepath.Glob("../cmd/kvgate/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/kvgate sources: %v", err)
	}
	flags := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !(strings.HasSuffix(sel.Sel.Name, "Var") || strings.HasSuffix(sel.Sel.Name, "VarP")) || len(call.Args) < 2 {
				return true
			}
			if lit, ok := call.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if name, err := strconv.Unquote(lit.Value); err == nil {
					flags[name] = true
				}
			}
			return true
		})
	}
	if !flags["api"] || !flags["state-dir"] {
		t.Fatalf("could not read cmd/kvgate's flags (found %v)", flags)
	}
	return flags
}

func TestDaemonSetShape(t *testing.T) {
	podSpec, kvgate := kvgatePod(t)
	if get(podSpec, "hostNetwork") != true {
		t.Errorf("hostNetwork must be true: VIPs and KV-event subscribers use the node's network")
	}

	// Flags exist in cmd/kvgate, and the paths agree with the mounts.
	known := kvgateFlags(t)
	args := map[string]string{}
	for _, a := range get(kvgate, "args").([]any) {
		s, _ := a.(string)
		name, value, _ := strings.Cut(strings.TrimPrefix(s, "--"), "=")
		if !known[name] {
			t.Errorf("arg %q: cmd/kvgate has no flag --%s", s, name)
		}
		args[name] = value
	}
	if args["api"] != "127.0.0.1:11111" {
		t.Errorf("--api=%q: keep the API on loopback (beyond it kvgate needs TLS too)", args["api"])
	}
	if args["api-token-file"] == "" {
		t.Errorf("no --api-token-file: the API must require tokens (docs/security.md)")
	}
	if m := args["metrics-addr"]; m == "" || !strings.HasPrefix(m, "127.0.0.1:") {
		t.Errorf("--metrics-addr=%q: the unauthenticated metrics listener must stay on loopback behind the proxy", m)
	}
	mounts := map[string]string{} // mountPath -> volume name
	for _, m := range get(kvgate, "volumeMounts").([]any) {
		mm := m.(map[string]any)
		mounts[mm["mountPath"].(string)] = mm["name"].(string)
	}
	hostPaths := map[string]string{} // volume name -> host path
	for _, v := range get(podSpec, "volumes").([]any) {
		vm := v.(map[string]any)
		if p, ok := get(vm, "hostPath", "path").(string); ok {
			hostPaths[vm["name"].(string)] = p
		}
	}
	for _, p := range []string{"/sys/fs/bpf", "/sys/fs/cgroup", args["tokenizer-dir"], args["state-dir"]} {
		if p == "" {
			t.Errorf("missing --tokenizer-dir or --state-dir")
			continue
		}
		if vol, ok := mounts[p]; !ok || hostPaths[vol] != p {
			t.Errorf("%s: want a hostPath volume of the same path mounted there (mount %q -> %q)", p, vol, hostPaths[vol])
		}
	}
	if pin := args["bpf-pin-dir"]; !strings.HasPrefix(pin, "/sys/fs/bpf/") {
		t.Errorf("--bpf-pin-dir=%q: must lie on the /sys/fs/bpf (bpffs) mount", pin)
	}
	if args["tokenizer-dir"] != "/etc/loxilb/tokenizers" || args["state-dir"] != "/var/lib/kvgate" {
		t.Errorf("tokenizer/state dirs %q %q: keep the spec's staging path and the documented state dir", args["tokenizer-dir"], args["state-dir"])
	}

	// Capabilities for BPF, without privileged.
	sc := get(kvgate, "securityContext")
	if get(sc, "privileged") == true {
		t.Errorf("the kvgate container should not be privileged: add capabilities instead")
	}
	var caps []string
	for _, c := range get(sc, "capabilities", "add").([]any) {
		caps = append(caps, c.(string))
	}
	for _, want := range []string{"BPF", "NET_ADMIN", "SYS_ADMIN"} {
		if !slices.Contains(caps, want) {
			t.Errorf("capabilities lack %s (the eBPF data path needs it)", want)
		}
	}
	if drop := get(sc, "capabilities", "drop", 0); drop != "ALL" {
		t.Errorf("capabilities.drop = %v, want [ALL]", drop)
	}

	// Probes reach the loopback API.
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		h := get(kvgate, probe, "httpGet")
		if get(h, "host") != "127.0.0.1" || get(h, "port") != 11111 {
			t.Errorf("%s: want httpGet on 127.0.0.1:11111, got %v", probe, h)
		}
	}

	// Termination: preStop sleep + --shutdown-grace < terminationGracePeriodSeconds.
	grace, err := time.ParseDuration(args["shutdown-grace"])
	if err != nil {
		t.Fatalf("--shutdown-grace: %v", err)
	}
	sleep, _ := get(kvgate, "lifecycle", "preStop", "sleep", "seconds").(int)
	tgps, _ := get(podSpec, "terminationGracePeriodSeconds").(int)
	if need := int(grace/time.Second) + sleep; tgps <= need {
		t.Errorf("terminationGracePeriodSeconds %d must exceed preStop sleep %d s + --shutdown-grace %s", tgps, sleep, grace)
	}

	// The scrape annotation points at the metrics proxy, which proxies /metrics
	// to kvgate's loopback metrics listener (no token needed there).
	ds := object(t, "kubernetes/base/daemonset.yaml", "DaemonSet", "kvgate")
	ann := get(ds, "spec", "template", "metadata", "annotations")
	proxy := container(t, podSpec, "metrics-proxy")
	port := get(proxy, "ports", 0, "containerPort")
	if get(ann, "prometheus.io/scrape") != "true" || get(ann, "prometheus.io/port") != strconv.Itoa(port.(int)) || get(ann, "prometheus.io/path") != "/metrics" {
		t.Errorf("scrape annotations %v do not point at the metrics proxy port %v", ann, port)
	}
	conf, _ := get(object(t, "kubernetes/base/daemonset.yaml", "ConfigMap", "kvgate-metrics-proxy"), "data", "default.conf").(string)
	if !strings.Contains(conf, fmt.Sprintf("listen %v;", port)) || !strings.Contains(conf, "proxy_pass http://"+args["metrics-addr"]+"/metrics;") {
		t.Errorf("metrics proxy config does not listen on %v and proxy to %s/metrics:\n%s", port, args["metrics-addr"], conf)
	}
	// Every Secret that holds a token or a key is mounted mode 0400; the
	// probes need none.
	for _, v := range get(podSpec, "volumes").([]any) {
		if sec, ok := get(v, "secret").(map[string]any); ok && get(sec, "defaultMode") != 0o400 {
			t.Errorf("secret volume %v: defaultMode %v, want 0400", get(v, "name"), get(sec, "defaultMode"))
		}
		if proj, ok := get(v, "projected").(map[string]any); ok && get(proj, "defaultMode") != 0o400 {
			t.Errorf("projected volume %v: defaultMode %v, want 0400", get(v, "name"), get(proj, "defaultMode"))
		}
	}
	checkTLSCertVolume(t, podSpec, mounts, args["tls-cert-dir"])
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		if p := get(kvgate, probe, "httpGet", "path"); p != "/readyz" && p != "/healthz" {
			t.Errorf("%s path %v needs a token; use /readyz or /healthz", probe, p)
		}
	}
}

// checkTLSCertVolume: --tls-cert-dir is a read-only projection of TLS
// Secrets, each one's tls.crt and tls.key in a <vip>_<port> directory, as
// kvgate looks them up (docs/security.md).
func checkTLSCertVolume(t *testing.T, podSpec any, mounts map[string]string, dir string) {
	t.Helper()
	if dir == "" {
		t.Errorf("no --tls-cert-dir: TLS rules (security 1, 2) could not start")
		return
	}
	vol, ok := mounts[dir]
	if !ok {
		t.Errorf("--tls-cert-dir=%s: no volume mounted there", dir)
		return
	}
	var sources []any
	for _, v := range get(podSpec, "volumes").([]any) {
		if get(v, "name") == vol {
			sources, _ = get(v, "projected", "sources").([]any)
		}
	}
	if len(sources) == 0 {
		t.Errorf("volume %s at --tls-cert-dir: want a projected volume of TLS Secrets", vol)
	}
	ruleDir := regexp.MustCompile(`^([0-9a-f.:]+)_([0-9]+)$`)
	for _, src := range sources {
		sec := get(src, "secret")
		paths := map[string]string{}
		for _, it := range get(sec, "items").([]any) {
			paths[get(it, "key").(string)] = get(it, "path").(string)
		}
		crt, key := paths["tls.crt"], paths["tls.key"]
		d := filepath.Dir(crt)
		m := ruleDir.FindStringSubmatch(d)
		if m == nil || net.ParseIP(m[1]) == nil || filepath.Base(crt) != "tls.crt" || key != d+"/tls.key" {
			t.Errorf("TLS Secret %v: items %v, want tls.crt and tls.key at <vip>_<port>/", get(sec, "name"), paths)
		}
		if get(sec, "optional") != true {
			t.Errorf("TLS Secret %v: want optional: true, so the DaemonSet starts before the Secret exists", get(sec, "name"))
		}
	}
}

// TestExampleRuleAndEngines checks the example rule (docs/api.md) validates with pkg/config
// under the DaemonSet's environment, and that the example vLLM engines agree
// with it on every leg of the parity triad (docs/deploy.md).
func TestExampleRuleAndEngines(t *testing.T) {
	_, kvgate := kvgatePod(t)
	env := containerEnv(kvgate)
	settings, err := config.SettingsFromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	cm := object(t, "kubernetes/base/rules-configmap.yaml", "ConfigMap", "kvgate-rules")
	data, _ := cm["data"].(map[string]any)
	if len(data) == 0 {
		t.Fatal("kvgate-rules has no rule")
	}
	var rule *config.Rule
	for key, v := range data {
		if !strings.HasSuffix(key, ".json") {
			t.Errorf("rule %s: the sidecar only posts *.json files", key)
		}
		var r config.Rule
		if err := json.Unmarshal([]byte(v.(string)), &r); err != nil {
			t.Fatalf("rule %s: %v", key, err)
		}
		if err := config.Validate(&r, settings); err != nil {
			t.Errorf("rule %s does not validate: %v", key, err)
		}
		rule = &r
	}

	// The Job posts a file that exists in the ConfigMap.
	job := object(t, "kubernetes/examples/rule-job.yaml", "Job", "kvgate-rule-qwen3")
	script := strings.Join(func() []string {
		var s []string
		for _, a := range get(job, "spec", "template", "spec", "containers", 0, "command").([]any) {
			s = append(s, a.(string))
		}
		return s
	}(), " ")
	posted := regexp.MustCompile(`@/rules/([^ \n]+)`).FindStringSubmatch(script)
	if posted == nil || data[posted[1]] == nil {
		t.Errorf("the Job posts %v, which is not a key of kvgate-rules", posted)
	}
	if get(job, "spec", "template", "spec", "volumes", 0, "configMap", "name") != "kvgate-rules" {
		t.Errorf("the Job does not mount kvgate-rules")
	}

	// The prefill engine of the vLLM example: flags and environment.
	dep := object(t, "kubernetes/examples/vllm.yaml", "Deployment", "vllm-qwen3-prefill-0")
	podSpec := get(dep, "spec", "template", "spec")
	vllm := container(t, podSpec, "vllm")
	flags := map[string]string{}
	for _, a := range get(vllm, "args").([]any) {
		name, value, _ := strings.Cut(strings.TrimPrefix(a.(string), "--"), "=")
		flags[name] = value
	}
	engineEnv := containerEnv(vllm)
	seed, ok := rule.HashSeed(settings)
	if !ok || engineEnv["PYTHONHASHSEED"] != seed {
		t.Errorf("hash seed: engine PYTHONHASHSEED=%q, kvgate seed %q (set %v): they must be equal", engineEnv["PYTHONHASHSEED"], seed, ok)
	}
	if engineEnv["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] != "1" {
		t.Errorf("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = %q, want 1", engineEnv["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"])
	}
	if flags["block-size"] != strconv.Itoa(rule.BlockSize()) {
		t.Errorf("block size: engine %q, rule %d", flags["block-size"], rule.BlockSize())
	}
	if flags["prefix-caching-hash-algo"] != rule.EffectiveHashAlgo() {
		t.Errorf("hash algorithm: engine %q, rule %q", flags["prefix-caching-hash-algo"], rule.EffectiveHashAlgo())
	}
	var events struct {
		Enable    bool   `json:"enable_kv_cache_events"`
		Publisher string `json:"publisher"`
		Endpoint  string `json:"endpoint"`
		Replay    string `json:"replay_endpoint"`
	}
	if err := json.Unmarshal([]byte(flags["kv-events-config"]), &events); err != nil {
		t.Fatalf("--kv-events-config: %v", err)
	}
	if !events.Enable || events.Publisher != "zmq" ||
		events.Endpoint != fmt.Sprintf("tcp://*:%d", rule.ZmqPort()) ||
		events.Replay != fmt.Sprintf("tcp://*:%d", rule.ReplayPort(settings.ReplayPortOffset)) {
		t.Errorf("--kv-events-config %+v does not publish on the rule's kvZmqPort %d and replay port %d",
			events, rule.ZmqPort(), rule.ReplayPort(settings.ReplayPortOffset))
	}
	// Every prefill endpoint is subscribed: the rule must tag one.
	prefill := 0
	for _, e := range rule.Endpoints {
		if e.Role == config.RolePrefill {
			prefill++
		}
	}
	if prefill == 0 {
		t.Errorf("the example rule has no prefill endpoint (ep_role 1): nothing would be subscribed")
	}
}

// TestContainerImage checks the Dockerfile builds every command statically
// with the module's Go version onto the documented base.
func TestContainerImage(t *testing.T) {
	b, err := os.ReadFile("container/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	dockerfile := string(b)
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go ([0-9.]+)$`).FindSubmatch(mod)
	if goVersion == nil {
		t.Fatal("go.mod has no go directive")
	}
	if !strings.Contains(dockerfile, "ARG GO_VERSION="+string(goVersion[1])+"\n") {
		t.Errorf("Dockerfile's GO_VERSION differs from go.mod's go %s", goVersion[1])
	}
	cmds, err := filepath.Glob("../cmd/*/main.go")
	if err != nil || len(cmds) == 0 {
		t.Fatalf("no commands under cmd/: %v", err)
	}
	for _, c := range cmds {
		name := filepath.Base(filepath.Dir(c))
		if !strings.Contains(dockerfile, "./cmd/"+name) || !strings.Contains(dockerfile, "/out/"+name) {
			t.Errorf("the image does not build and copy cmd/%s", name)
		}
	}
	for _, want := range []string{
		"CGO_ENABLED=0", "-trimpath", "-X main.version=",
		"FROM gcr.io/distroless/static-debian12:nonroot", "USER 65532:65532",
		`ENTRYPOINT ["/usr/local/bin/kvgate"]`,
		"org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.revision",
	} {
		if !strings.Contains(dockerfile, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	st, err := os.Stat("container/build.sh")
	if err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("container/build.sh missing or not executable: %v", err)
	}
}

// TestKustomization checks every resource and patch the kustomizations name
// exists.
func TestKustomization(t *testing.T) {
	for _, dir := range []string{"kubernetes/base", "kubernetes/userspace"} {
		docs := yamlDocs(t, filepath.Join(dir, "kustomization.yaml"))
		res, _ := get(docs[0], "resources").([]any)
		if len(res) == 0 {
			t.Errorf("%s: lists no resources", dir)
		}
		for _, r := range res {
			if _, err := os.Stat(filepath.Join(dir, r.(string))); err != nil {
				t.Errorf("%s: resource %v: %v", dir, r, err)
			}
		}
		patches, _ := get(docs[0], "patches").([]any)
		for _, p := range patches {
			if _, err := os.Stat(filepath.Join(dir, get(p, "path").(string))); err != nil {
				t.Errorf("%s: patch %v: %v", dir, p, err)
			}
		}
	}
}

// TestUserspaceOverlay renders the non-root overlay with kubectl's kustomize
// and checks that no BPF piece is left and kvgate runs as 65532.
func TestUserspaceOverlay(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed: the overlay is not rendered")
	}
	out, err := exec.Command(kubectl, "kustomize", "kubernetes/userspace").Output()
	if err != nil {
		t.Fatalf("kubectl kustomize kubernetes/userspace: %v", err)
	}
	path := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	podSpec := get(object(t, path, "DaemonSet", "kvgate"), "spec", "template", "spec")
	kvgate := container(t, podSpec, "kvgate")
	known := kvgateFlags(t)
	var datapath string
	for _, a := range get(kvgate, "args").([]any) {
		name, value, _ := strings.Cut(strings.TrimPrefix(a.(string), "--"), "=")
		if !known[name] || name == "bpf-pin-dir" {
			t.Errorf("arg %v: unknown flag, or a BPF one", a)
		}
		if name == "datapath" {
			datapath = value
		}
	}
	if datapath != "userspace" {
		t.Errorf("--datapath=%q, want userspace", datapath)
	}
	sc := get(kvgate, "securityContext")
	if get(sc, "runAsUser") != 65532 || get(sc, "runAsNonRoot") != true || get(sc, "capabilities", "add") != nil {
		t.Errorf("kvgate securityContext %v: want runAsUser 65532, runAsNonRoot and no added capability", sc)
	}
	for _, c := range get(podSpec, "initContainers").([]any) {
		if get(c, "securityContext", "privileged") == true || get(c, "name") == "mount-bpffs" {
			t.Errorf("init container %v is privileged or mounts bpffs", get(c, "name"))
		}
	}
	for _, m := range get(kvgate, "volumeMounts").([]any) {
		if p := get(m, "mountPath").(string); strings.HasPrefix(p, "/sys/") {
			t.Errorf("mount %s left in the userspace overlay", p)
		}
	}
	for _, v := range get(podSpec, "volumes").([]any) {
		if p, _ := get(v, "hostPath", "path").(string); strings.HasPrefix(p, "/sys/") {
			t.Errorf("hostPath %s left in the userspace overlay", p)
		}
	}
	// The environment is the base's, unchanged.
	_, base := kvgatePod(t)
	if !reflect.DeepEqual(containerEnv(kvgate), containerEnv(base)) {
		t.Errorf("the overlay changed kvgate's environment")
	}
}

// TestDaemonSetStartsKvgate runs the real kvgate binary with the DaemonSet's
// flags and environment (paths and addresses moved to the test's own
// loopback address and temporary directories, --datapath=userspace so the
// test does not load BPF), then does what the kubelet and the sidecars do:
// the readiness probe, the metrics proxy's GET /metrics, the rules-sync POST
// of the ConfigMap's rule (its addresses moved onto 127.77.0.0/16), and
// SIGTERM within terminationGracePeriodSeconds.
func TestDaemonSetStartsKvgate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs cmd/kvgate")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build cmd/kvgate: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvgate")
	build := exec.Command(goBin, "build", "-o", bin, "../cmd/kvgate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kvgate: %v\n%s", err, out)
	}

	podSpec, kvgate := kvgatePod(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apiAddr := ln.Addr().String()
	ln.Close()
	if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	// The two Secrets as an operator creates them: the API's token file with
	// the rules-sync sidecar's token as an admin, and that token alone.
	const opsToken, syncToken = "ops-token-0123456789abcdef", "rules-sync-token-0123456789abcdef"
	secrets := filepath.Join(dir, "secrets")
	tokensFile := filepath.Join(secrets, "api", "tokens")
	for path, content := range map[string]string{
		tokensFile: "ops admin " + opsToken + "\nrules-sync admin " + syncToken + "\n",
		filepath.Join(secrets, "rules-sync", "token"): syncToken + "\n",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	sidecarTokens := filepath.Join(dir, "sidecar-tokens")
	if err := os.MkdirAll(sidecarTokens, 0o700); err != nil {
		t.Fatal(err)
	}
	var args []string
	var grace time.Duration
	for _, a := range get(kvgate, "args").([]any) {
		name, value, _ := strings.Cut(strings.TrimPrefix(a.(string), "--"), "=")
		switch name {
		case "api":
			value = apiAddr
		case "tokenizer-dir", "state-dir", "bpf-pin-dir", "tls-cert-dir":
			value = filepath.Join(dir, name)
			if err := os.MkdirAll(value, 0o700); err != nil {
				t.Fatal(err)
			}
		case "datapath":
			value = "userspace"
		case "api-token-file":
			value = tokensFile
		case "metrics-addr":
			value = metricsAddr
		case "shutdown-grace":
			if grace, err = time.ParseDuration(value); err != nil {
				t.Fatal(err)
			}
		}
		args = append(args, "--"+name+"="+value)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	for k, v := range containerEnv(kvgate) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("kvgate output:\n%s", logs.String())
		}
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	base := "http://" + apiAddr
	probe := get(kvgate, "readinessProbe", "httpGet", "path").(string)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(base + probe)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("kvgate exited before ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness probe %s not 200 within 30 s (last error %v)", probe, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The ConfigMap's rules, their addresses moved to loopback, as the files
	// the sidecar and the Job read.
	rulesDir := filepath.Join(dir, "rules")
	if err := os.MkdirAll(rulesDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cm := object(t, "kubernetes/base/rules-configmap.yaml", "ConfigMap", "kvgate-rules")
	bodies := map[string]string{}
	for key, v := range cm["data"].(map[string]any) {
		var r config.Rule
		if err := json.Unmarshal([]byte(v.(string)), &r); err != nil {
			t.Fatal(err)
		}
		// The same body with only the addresses moved: the VIP to a free
		// loopback port (tests may run concurrently), the endpoints to
		// 127.77.0.0/16 where nothing listens.
		var generic map[string]any
		if err := json.Unmarshal([]byte(v.(string)), &generic); err != nil {
			t.Fatal(err)
		}
		vip, err := net.Listen("tcp", "127.77.0.254:0")
		if err != nil {
			t.Fatal(err)
		}
		vipPort := vip.Addr().(*net.TCPAddr).Port
		vip.Close()
		sa := generic["serviceArguments"].(map[string]any)
		sa["externalIP"], sa["port"] = "127.77.0.254", vipPort
		for i, e := range generic["endpoints"].([]any) {
			e.(map[string]any)["endpointIP"] = fmt.Sprintf("127.77.0.%d", i+1)
		}
		moved, err := json.Marshal(generic)
		if err != nil {
			t.Fatal(err)
		}
		body := string(moved)
		bodies[key] = body
		if err := os.WriteFile(filepath.Join(rulesDir, key), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	localize := func(script string) string {
		tmp := filepath.Join(dir, "tmp")
		_ = os.MkdirAll(tmp, 0o700)
		return strings.NewReplacer("http://127.0.0.1:11111", base, "/rules/", rulesDir+"/", "/tmp/", tmp+"/",
			"/secrets/rules-sync/", filepath.Join(secrets, "rules-sync")+"/", "/run/kvgate-tokens/", sidecarTokens+"/").Replace(script)
	}
	script := func(c map[string]any) string {
		cmd := get(c, "command").([]any)
		if len(cmd) != 3 || cmd[0] != "sh" || cmd[1] != "-c" {
			t.Fatalf("container %v: want command [sh, -c, script]", c["name"])
		}
		return cmd[2].(string)
	}
	_, curlErr := exec.LookPath("curl")
	_, shaErr := exec.LookPath("sha256sum")
	// The init step that gives the sidecar its own header file.
	initScript := ""
	for _, c := range get(podSpec, "initContainers").([]any) {
		if get(c, "name") == "sidecar-tokens" {
			initScript = script(c.(map[string]any))
		}
	}
	if initScript == "" {
		t.Fatal("no sidecar-tokens init container")
	}
	if os.Geteuid() != 0 {
		initScript = strings.ReplaceAll(initScript, "chown 100:100", "true")
	}
	if out, err := exec.Command("sh", "-c", localize(initScript)).CombinedOutput(); err != nil {
		t.Fatalf("sidecar-tokens: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(sidecarTokens, "rules-sync.header")); err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("rules-sync header: %v %v", fi, err)
	}
	// Without a token the API refuses; probes need none.
	if resp, err := client.Get(base + "/netlox/v1/config/loadbalancer/all"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the API without a token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if curlErr == nil && shaErr == nil {
		// The rules-sync sidecar's loop, until it reports every rule applied.
		sidecar := exec.Command("sh", "-c", localize(script(container(t, podSpec, "rules-sync"))))
		var out syncbuf.Buffer
		sidecar.Stdout, sidecar.Stderr = &out, &out
		// Its own process group, so that killing it also ends its sleep.
		sidecar.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		sidecar.WaitDelay = 5 * time.Second
		if err := sidecar.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		applied := func() int {
			n := 0
			for _, line := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(line, "applied ") {
					n++
				}
			}
			return n
		}
		for applied() < len(bodies) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("rules-sync: %s", out.String())
		_ = syscall.Kill(-sidecar.Process.Pid, syscall.SIGKILL)
		_ = sidecar.Wait()
		if n := applied(); n < len(bodies) || strings.Contains(out.String(), "not applied") {
			t.Errorf("rules-sync applied %d of %d rules:\n%s", n, len(bodies), out.String())
		}
		// The one-shot Job re-posts (updates) its rule and lists the rules.
		job := object(t, "kubernetes/examples/rule-job.yaml", "Job", "kvgate-rule-qwen3")
		jobScript := localize(script(get(job, "spec", "template", "spec", "containers", 0).(map[string]any)))
		if jobOut, err := exec.Command("sh", "-c", jobScript).CombinedOutput(); err != nil || !bytes.Contains(jobOut, []byte(`"result":"Success"`)) {
			t.Errorf("rule Job: %v\n%s", err, jobOut)
		}
	} else {
		t.Logf("curl or sha256sum missing: posting the rules from Go instead of running the sidecar and Job scripts")
		for key, body := range bodies {
			req, _ := http.NewRequest("POST", base+"/netlox/v1/config/loadbalancer", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+syncToken)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !bytes.Contains(answer, []byte(`"service_id"`)) {
				t.Errorf("POST %s: %d %s", key, resp.StatusCode, answer)
			}
		}
	}

	// The metrics proxy's upstream (no token), and the series the dashboard starts from.
	resp, err := client.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	exposition, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	for _, want := range []string{"kvgate_build_info{", "kvgate_datapath_info{path=\"userspace\"} 1", "loxilb_pd_kv_tier15_fallthrough_total{service=\"1\"} 0", "kvgate_rules 1"} {
		if !bytes.Contains(exposition, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	checkMetricsProxy(t, dir, "http://"+metricsAddr)

	// SIGTERM: kvgate must exit (0) within the pod's termination grace period.
	tgps, _ := get(podSpec, "terminationGracePeriodSeconds").(int)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("kvgate exit after SIGTERM: %v", err)
		}
	case <-time.After(time.Duration(tgps)*time.Second + grace):
		t.Errorf("kvgate still running %d s after SIGTERM", tgps)
	}
}

// checkMetricsProxy runs Debian's nginx with the metrics-proxy sidecar's
// server block (listen address and upstream moved to the test's) in front of
// the running kvgate at base: GET /metrics passes, everything else is refused.
func checkMetricsProxy(t *testing.T, dir, base string) {
	t.Helper()
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		if nginx, err = exec.LookPath("/usr/sbin/nginx"); err != nil {
			if os.Getenv("KVGATE_REQUIRE_INTEROP") != "" {
				t.Fatalf("nginx (Debian nginx-light) is needed to test the metrics proxy: %v", err)
			}
			t.Logf("nginx missing: metrics-proxy config not exercised")
			return
		}
	}
	conf, _ := get(object(t, "kubernetes/base/daemonset.yaml", "ConfigMap", "kvgate-metrics-proxy"), "data", "default.conf").(string)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := ln.Addr().String()
	ln.Close()
	server := strings.NewReplacer("listen 9111;", "listen "+proxyAddr+";", "http://127.0.0.1:9112", base).Replace(conf)
	prefix := filepath.Join(dir, "nginx")
	for _, d := range []string{"logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(prefix, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	main := fmt.Sprintf(`pid %[1]s/nginx.pid;
error_log %[1]s/logs/error.log;
events { worker_connections 64; }
http {
  client_body_temp_path %[1]s/tmp/body;
  proxy_temp_path %[1]s/tmp/proxy;
  fastcgi_temp_path %[1]s/tmp/fastcgi;
  uwsgi_temp_path %[1]s/tmp/uwsgi;
  scgi_temp_path %[1]s/tmp/scgi;
  include %[1]s/default.conf;
}
`, prefix)
	if err := os.WriteFile(filepath.Join(prefix, "default.conf"), []byte(server), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prefix, "nginx.conf"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginx, "-p", prefix, "-c", filepath.Join(prefix, "nginx.conf"), "-g", "daemon off; master_process off;")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			logs, _ := os.ReadFile(filepath.Join(prefix, "logs", "error.log"))
			t.Logf("nginx output:\n%s\n%s", out.String(), logs)
		}
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	url := "http://" + proxyAddr
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url + "/metrics")
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("kvgate_build_info")) {
				t.Errorf("GET /metrics through the proxy: %d, %d bytes", resp.StatusCode, len(body))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics proxy not answering: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, tc := range []struct{ method, path string }{
		{"POST", "/metrics"},
		{"GET", "/netlox/v1/config/loadbalancer/all"},
		{"POST", "/netlox/v1/config/loadbalancer"},
		{"DELETE", "/netlox/v1/config/loadbalancer/all"},
		{"GET", "/netlox/v1/metrics"},
	} {
		req, _ := http.NewRequest(tc.method, url+tc.path, strings.NewReader("{}"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s through the metrics proxy: %d, want 403 or 404", tc.method, tc.path, resp.StatusCode)
		}
	}
}

// TestDashboardGenerated checks kvgate.json is what generate.py writes, so
// the two never drift.
func TestDashboardGenerated(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	out, err := exec.Command(python, "grafana/generate.py").Output()
	if err != nil {
		t.Fatalf("grafana/generate.py: %v", err)
	}
	committed, err := os.ReadFile("grafana/kvgate.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, committed) {
		t.Errorf("grafana/kvgate.json differs from generate.py's output: run python3 deploy/grafana/generate.py > deploy/grafana/kvgate.json")
	}
}
