package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/recovery"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/fullproxy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvhash"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/models"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// TestModelViewResolve: a request routes only among the endpoints that
// list its model; endpoints not read yet stay candidates for every model;
// a model nobody lists is not found once every endpoint is known; an
// adapter routes to its endpoints, tokenizes with its parent and keys its
// blocks under the parent's salt.
func TestModelViewResolve(t *testing.T) {
	a := models.Served{Bases: []string{"model-a", "alias-a"}, Adapters: map[string]string{"sql-lora": "model-a"}}
	b := models.Served{Bases: []string{"model-b"}}
	all := epset.Of(0, 1, 2, 3)
	cases := []struct {
		name     string
		served   map[int]models.Served
		model    string
		eligible epset.Set
		notFound bool
		salt     inventory.ModelSalt
		parent   string
		label    string
	}{
		{"nothing discovered: every endpoint", nil, "model-a", all, false, 0, "", labelUnlisted},
		{"base model", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "model-a", epset.Of(0, 1), false, inventory.SaltFor("model-a"), "", "model-a"},
		{"alias keys as the first name", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "alias-a", epset.Of(0, 1), false, inventory.SaltFor("model-a"), "", "alias-a"},
		{"other base model", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "model-b", epset.Of(2, 3), false, inventory.SaltFor("model-b"), "", "model-b"},
		{"adapter", map[int]models.Served{0: a, 1: b, 2: b, 3: b}, "sql-lora", epset.Of(0), false, inventory.SaltFor("model-a"), "model-a", "sql-lora"},
		{"unknown model, all known", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "gpt-x", epset.Set{}, true, 0, "", labelUnlisted},
		{"unknown model, one endpoint unread", map[int]models.Served{0: a, 1: a, 2: b}, "gpt-x", epset.Of(3), false, 0, "", labelUnlisted},
		{"known model plus an unread endpoint", map[int]models.Served{0: a, 1: a, 2: b}, "model-b", epset.Of(2, 3), false, inventory.SaltFor("model-b"), "", "model-b"},
		{"endpoints outside the rule do not count", map[int]models.Served{0: a, 1: a, 2: b, 3: b, 9: {Bases: []string{"gone"}}}, "gone", epset.Set{}, true, inventory.SaltFor("gone"), "", "gone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var v *modelView
			if c.served != nil {
				v = buildView(c.served)
			}
			r := v.resolve(c.model, all)
			if r.eligible != c.eligible || r.notFound != c.notFound || r.salt != c.salt || r.parent != c.parent || r.label != c.label {
				t.Fatalf("resolve(%q) = %+v; want eligible %v notFound %v salt %x parent %q label %q",
					c.model, r, c.eligible, c.notFound, c.salt, c.parent, c.label)
			}
			if r.restrict != (r.eligible != all) {
				t.Fatalf("restrict %v with eligible %v of %v", r.restrict, r.eligible, all)
			}
		})
	}
}

// TestModelViewBounds: endpoint keys follow their base model, and the
// model label takes at most maxModelLabels values per rule.
func TestModelViewBounds(t *testing.T) {
	served := map[int]models.Served{}
	for ep := range 100 {
		served[ep] = models.Served{Bases: []string{"m" + string(rune('A'+ep/26)) + string(rune('a'+ep%26))}}
	}
	v := buildView(served)
	labels := map[string]bool{}
	for _, e := range v.byModel {
		labels[e.label] = true
	}
	if len(labels) != maxModelLabels+1 || !labels[labelOther] {
		t.Fatalf("%d distinct labels (other: %v), want %d plus %q", len(labels), labels[labelOther], maxModelLabels, labelOther)
	}
	if v.endpointSalt(5) != inventory.SaltFor(served[5].Base()) || v.endpointSalt(200) != 0 || (*modelView)(nil).endpointSalt(1) != 0 {
		t.Fatal("endpoint salts must be their base model's, 0 for unknown endpoints")
	}
	if got := metricLabel("a b\"c}" + string(make([]byte, 200))); len(got) != 128 || got[:6] != "a_b_c_" {
		t.Fatalf("metricLabel kept %q", got[:8])
	}
}

// TestRouterPerModel: through the router, a request for each model is
// tokenized with its own staged tokenizer (an adapter's with its discovered
// parent), its hashes are keyed by its model, so two models with one
// tokenizer and one seed never share a key, and the endpoints that do not
// serve it are excluded; a model nobody serves is marked not found.
func TestRouterPerModel(t *testing.T) {
	rule := mustRule(t, `{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3},
		"endpoints":[{"endpointIP":"127.0.0.1","targetPort":10},{"endpointIP":"127.0.0.1","targetPort":11},{"endpointIP":"127.0.0.1","targetPort":12}]}`)
	rule.AssignIndices(nil)
	st, err := newRuleState(rule, config.DefaultSettings(), quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	rm := &ruleModels{}
	rm.view.Store(buildView(map[int]models.Served{
		0: {Bases: []string{baseModel}, Adapters: map[string]string{"sql-lora": baseModel}},
		1: {Bases: []string{"model-b"}},
		2: {Bases: []string{"model-b"}},
	}))
	st.models = rm
	sel, err := selector.New(selectorRule(rule), selector.DefaultOptions(), selector.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	dir := stagedQwen3(t)
	if err := os.Symlink(filepath.Join(dir, tokenizer.Slug(baseModel)), filepath.Join(dir, tokenizer.Slug("model-b"))); err != nil {
		t.Fatal(err)
	}
	pool := tokenizer.NewPool(dir)
	r := &router{service: 1, sel: sel, opts: selector.DefaultOptions(), pool: pool, log: quietLogger()}
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)
	m, err := pool.Get(baseModel)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m.EncodePrompt(prompt, nil)
	if err != nil {
		t.Fatal(err)
	}
	keyed := func(model, lora string) []uint64 {
		h := st.hasher.AppendHashes(nil, ids, kvhash.Extra{LoRAName: lora})
		inventory.SaltFor(model).KeyAll(h)
		return h
	}
	cases := []struct {
		model    string
		lora     string
		hashes   []uint64
		excluded epset.Set
		notFound bool
	}{
		{baseModel, "", keyed(baseModel, ""), epset.Of(1, 2), false},
		{"model-b", "", keyed("model-b", ""), epset.Of(0), false},
		{"sql-lora", "sql-lora", keyed(baseModel, "sql-lora"), epset.Of(1, 2), false},
		{"nobody", "", nil, epset.Of(0, 1, 2), true},
	}
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			req := &fullproxy.Request{Target: "/v1/completions", BodyInspected: true, RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1},
				Body: fmt.Appendf(nil, `{"model":%q,"prompt":%q}`, c.model, prompt)}
			sc := r.prepare(st, req)
			if sc.model.notFound != c.notFound || sc.facts.LoRA != c.lora {
				t.Fatalf("notFound %v lora %q; want %v %q", sc.model.notFound, sc.facts.LoRA, c.notFound, c.lora)
			}
			if !slices.Equal(sc.selReq.Hashes, c.hashes) {
				t.Fatalf("hashes %v, want %v", sc.selReq.Hashes, c.hashes)
			}
			if got := sc.attempt.Excluded(); got != c.excluded {
				t.Fatalf("excluded %v, want %v", got, c.excluded)
			}
		})
	}
	a, b := keyed(baseModel, ""), keyed("model-b", "")
	for i := range a {
		if a[i] == b[i] {
			t.Fatalf("block %d: two models with one tokenizer and seed share a key", i)
		}
	}
}

// TestDiscoveryRereads: discovery reads an endpoint at start, again when
// its probe comes up (kick; the interval here is an hour, so only the kick
// can explain the re-read), tells the gateway when the endpoint's key
// changes, keeps the last listing when a read fails and counts the failure.
func TestDiscoveryRereads(t *testing.T) {
	var mu sync.Mutex
	body, status := `{"data":[{"id":"model-a"}]}`, 200
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	rule := mustRule(t, fmt.Sprintf(`{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3},
		"endpoints":[{"endpointIP":%q,"targetPort":%s}]}`, host, port))
	rule.AssignIndices(nil)
	s := config.DefaultSettings()
	s.ModelDiscoveryInterval = time.Hour
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	g := &Gateway{opts: Options{Settings: s}, Metrics: m, log: quietLogger(), guard: recovery.New(quietLogger(), m)}
	var changes atomic.Int32
	rm := g.newRuleModels(rule, nil, nil, func() { changes.Add(1) })
	defer rm.close()
	base := func() string {
		v := rm.current()
		if v == nil || !v.known.Has(0) {
			return ""
		}
		return v.base[0]
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait("the first read", func() bool { return base() == "model-a" && rm.Tried(0) && changes.Load() == 1 })

	mu.Lock()
	body = `{"data":[{"id":"model-b"},{"id":"b-lora","parent":"model-b"}]}`
	mu.Unlock()
	rm.kick(0)
	wait("the re-read on probe-up", func() bool { return base() == "model-b" && changes.Load() == 2 })
	if e, ok := rm.current().lookup("b-lora"); !ok || e.parent != "model-b" {
		t.Fatalf("adapter not discovered: %+v", e)
	}

	mu.Lock()
	status, body = 500, `oops`
	mu.Unlock()
	rm.kick(0)
	wait("the failed read to be counted", func() bool {
		return gatheredSum(t, m, "kvgate_model_discovery_errors_total") == 1
	})
	if base() != "model-b" || changes.Load() != 2 {
		t.Fatalf("a failed read changed the view: base %q, %d changes", base(), changes.Load())
	}
	// What status and preflight show: the kept listing, when, and why the
	// last read failed; a good read clears the error.
	st, ok := rm.State(0)
	if !ok || st.Served.Base() != "model-b" || st.Served.Adapters["b-lora"] != "model-b" || st.CheckedAt.IsZero() || !strings.Contains(st.Err, "status 500") {
		t.Fatalf("state after a failed read: %+v %v", st, ok)
	}
	if _, ok := rm.State(7); ok {
		t.Fatal("state of an endpoint the rule does not have")
	}
	mu.Lock()
	status, body = 200, `{"data":[{"id":"model-b"}]}`
	mu.Unlock()
	rm.kick(0)
	wait("the good read to clear the error", func() bool { st, _ := rm.State(0); return st.Err == "" && len(st.Served.Adapters) == 0 })
}

// gatheredSum sums a family's samples from the registry.
func gatheredSum(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			sum += mt.GetCounter().GetValue() + mt.GetGauge().GetValue()
		}
	}
	return sum
}

// TestDiscoveryRetriesFailedRead: a failed read is tried again after the
// rule's probeInterval, without a kick and long before the hour-long
// interval, so an engine that was still starting when it was read is listed
// once it serves.
func TestDiscoveryRetriesFailedRead(t *testing.T) {
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"data":[{"id":"model-a"}]}`))
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	rule := mustRule(t, fmt.Sprintf(`{"serviceArguments":{"externalIP":"127.0.0.1","port":9,"mode":4,"kvExactMode":3,"probeInterval":1},
		"endpoints":[{"endpointIP":%q,"targetPort":%s}]}`, host, port))
	rule.AssignIndices(nil)
	s := config.DefaultSettings()
	s.ModelDiscoveryInterval = time.Hour
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	g := &Gateway{opts: Options{Settings: s}, Metrics: m, log: quietLogger(), guard: recovery.New(quietLogger(), m)}
	rm := g.newRuleModels(rule, nil, nil, nil)
	defer rm.close()
	deadline := time.Now().Add(10 * time.Second)
	for st, _ := rm.State(0); st.Err == ""; st, _ = rm.State(0) {
		if time.Now().After(deadline) {
			t.Fatal("the first read never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	up.Store(true)
	for st, _ := rm.State(0); st.Served.Base() != "model-a" || st.Err != ""; st, _ = rm.State(0) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed read was not retried: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
