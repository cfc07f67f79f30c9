package status

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
	"github.com/kvgate/kvgate/pkg/models"
)

// fleet is a registry with the series the collector reads, two rules and a
// clock the test moves.
type fleet struct {
	reg                     *prometheus.Registry
	hits, misses            *prometheus.CounterVec
	probe, breaker, blocks  *prometheus.GaugeVec
	parity, inflight, admin *prometheus.GaugeVec
	now                     time.Time
	subs                    []ingest.EndpointStatus
	rules                   []*config.Rule
	collector               *Collector
	mismatches              map[int]uint64 // the usage audit's prompt-token mismatches per rule
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	f := &fleet{reg: prometheus.NewRegistry(), now: time.Unix(1_800_000_000, 0), mismatches: map[int]uint64{}}
	cv := func(name string, l ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: name}, l)
		f.reg.MustRegister(c)
		return c
	}
	gv := func(name string, l ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: name}, l)
		f.reg.MustRegister(g)
		return g
	}
	f.hits = cv(mHits, "service", "ep_idx")
	f.misses = cv(mMisses, "service", "reason")
	f.probe = gv(mProbeUp, "service", "ep_idx")
	f.breaker = gv(mBreaker, "service", "ep_idx")
	f.blocks = gv(mBlocks, "service", "ep_idx")
	f.parity = gv(mParity, "service", "ep_idx")
	f.inflight = gv(mInflight, "service", "ep_idx")
	f.admin = gv(mAdminDown, "service", "ep_idx")
	kv := &config.Rule{ServiceID: 1, Args: config.ServiceArguments{ExternalIP: "10.0.0.1", Port: 8080, Mode: config.ModeFullProxy,
		KVExactMode: config.KVModeSinglePool, Name: "chat"},
		Endpoints: []config.Endpoint{{Idx: 0, IP: "10.0.1.1", TargetPort: 8000}, {Idx: 1, IP: "10.0.1.2", TargetPort: 8000}}}
	plain := &config.Rule{ServiceID: 2, Args: config.ServiceArguments{ExternalIP: "10.0.0.2", Port: 80, Mode: config.ModeFullProxy},
		Endpoints: []config.Endpoint{{Idx: 0, IP: "10.0.2.1", TargetPort: 8000, AdminDown: true}}}
	f.rules = []*config.Rule{plain, kv}
	f.subs = []ingest.EndpointStatus{
		{Key: "1/10.0.1.1:5557", Service: 1, EPIdx: 0, Ranks: []ingest.RankStatus{{Rank: 0, Connected: true, LastSeq: 7, HasSeq: true}}},
		{Key: "1/10.0.1.2:5557", Service: 1, EPIdx: 1, Ranks: []ingest.RankStatus{{Rank: 0, Connected: false}}},
	}
	f.collector = New(Options{
		Rules:            func() []*config.Rule { return slices.Clone(f.rules) },
		Subscribers:      func() []ingest.EndpointStatus { return f.subs },
		Gatherer:         f.reg,
		Datapath:         func() string { return "sockmap" },
		SeedSet:          func(r *config.Rule) bool { return r.ServiceID == 1 },
		Interval:         5 * time.Second,
		Window:           3,
		Now:              func() time.Time { return f.now },
		PromptMismatches: func(service int) uint64 { return f.mismatches[service] },
	})
	for _, ep := range []string{"0", "1"} {
		f.probe.WithLabelValues("1", ep).Set(1)
	}
	return f
}

func (f *fleet) tick(d time.Duration) {
	f.now = f.now.Add(d)
	f.collector.Sample()
}

func kinds(st Status) []string {
	var out []string
	for _, p := range st.Problems {
		out = append(out, p.Kind)
	}
	slices.Sort(out)
	return out
}

func TestSnapshot(t *testing.T) {
	f := newFleet(t)
	f.tick(0)
	f.hits.WithLabelValues("1", "0").Add(10)
	f.misses.WithLabelValues("1", "shallow").Add(4)
	f.blocks.WithLabelValues("1", "0").Set(100)
	f.blocks.WithLabelValues("1", "1").Set(50) // blocks, and no hit while requests miss
	f.inflight.WithLabelValues("1", "0").Set(3)
	f.tick(5 * time.Second)
	f.now = f.now.Add(2 * time.Second)

	st := f.collector.Snapshot()
	if len(st.Rules) != 2 || st.Rules[0].ServiceID != 1 || st.Rules[1].ServiceID != 2 {
		t.Fatalf("rules not sorted by service_id: %+v", st.Rules)
	}
	r := st.Rules[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"datapath", st.Datapath, "sockmap"},
		{"window: from the oldest sample to now", st.WindowSeconds, 7.0},
		{"mode", r.Mode, "kv-pool"},
		{"contract", r.Contract, Contract{Engine: "vllm", HashAlgo: "sha256_cbor", BlockSize: 16, SeedSet: true}},
		{"parity with no verdict", r.Parity, "unknown"},
		{"rule hits in window", r.HitsWindow, 10.0},
		{"misses by reason", r.MissesWindow["shallow"], 4.0},
		{"ep0 hit rate", r.Endpoints[0].HitRate, []float64{2}},
		{"ep0 inflight", r.Endpoints[0].Inflight, 3.0},
		{"ep0 health", r.Endpoints[0].Health, "up"},
		{"ep0 last event age", r.Endpoints[0].Subscriber.LastEventAgeSeconds, 7.0},
		{"ep1 subscriber", *r.Endpoints[1].Subscriber, Subscriber{Connected: false, Ranks: 1, LastEventAgeSeconds: -1}},
		{"plain rule mode", st.Rules[1].Mode, "plain"},
		{"plain rule has no subscriber", st.Rules[1].Endpoints[0].Subscriber == nil, true},
		{"plain rule health unknown", st.Rules[1].Endpoints[0].Health, "unknown"},
		{"problems", kinds(st), []string{"blocks_no_hits", "subscriber_down"}},
	}
	for _, c := range checks {
		if !equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestProblems(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *fleet)
		want  []string
	}{
		{"parity broken", func(f *fleet) { f.parity.WithLabelValues("1", "0").Set(-1) }, []string{"parity_broken", "subscriber_down"}},
		{"parity ok", func(f *fleet) { f.parity.WithLabelValues("1", "0").Set(1) }, []string{"subscriber_down"}},
		{"endpoint down", func(f *fleet) { f.probe.WithLabelValues("1", "0").Set(0) }, []string{"endpoint_down", "subscriber_down"}},
		{"breaker open", func(f *fleet) { f.breaker.WithLabelValues("1", "0").Set(1) }, []string{"breaker_open", "subscriber_down"}},
		{"blocks without misses are fine", func(f *fleet) { f.blocks.WithLabelValues("1", "0").Set(9) }, []string{"subscriber_down"}},
		{"all well", func(f *fleet) { f.subs[1].Ranks[0].Connected = true }, nil},
		{"prompt-token mismatches in the window", func(f *fleet) { f.subs[1].Ranks[0].Connected = true; f.mismatches[1] = 3 }, []string{"prompt_tokens_mismatch"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			f.tick(0)
			tc.setup(f)
			f.tick(5 * time.Second)
			if got := kinds(f.collector.Snapshot()); !slices.Equal(got, tc.want) {
				t.Fatalf("problems %v, want %v", got, tc.want)
			}
		})
	}
}

// The window slides: rates cover at most Window intervals, and a subscriber
// that goes away is forgotten.
func TestWindowSlides(t *testing.T) {
	f := newFleet(t)
	for i := range 6 {
		f.hits.WithLabelValues("1", "0").Add(float64(5 * i))
		f.tick(5 * time.Second)
	}
	st := f.collector.Snapshot()
	if got := st.Rules[0].Endpoints[0].HitRate; !slices.Equal(got, []float64{3, 4, 5}) {
		t.Fatalf("hit rate %v, want the last 3 intervals", got)
	}
	if st.WindowSeconds != 15 {
		t.Fatalf("window %v s", st.WindowSeconds)
	}
	f.subs = f.subs[:1]
	f.tick(time.Second)
	if n := len(f.collector.lastSeq); n != 1 {
		t.Fatalf("%d ranks remembered after one went away", n)
	}
}

func equal(a, b any) bool {
	switch x := a.(type) {
	case []float64:
		y, _ := b.([]float64)
		return slices.Equal(x, y)
	case []string:
		y, _ := b.([]string)
		return slices.Equal(x, y)
	}
	return a == b
}

// TestEndpointDownSaysWhy: an endpoint_down problem carries the probe's
// reason, so the page and kvctl status say what to fix.
func TestEndpointDownSaysWhy(t *testing.T) {
	f := newFleet(t)
	const why = "http probe 10.0.1.1:8000/v1/models: status 401: engine requires a token (backendTokenFile)"
	f.collector.opts.ProbeError = func(service, ep int) string {
		if service == 1 && ep == 0 {
			return why
		}
		return ""
	}
	f.tick(0)
	f.probe.WithLabelValues("1", "0").Set(0)
	f.tick(5 * time.Second)
	st := f.collector.Snapshot()
	var detail string
	for _, p := range st.Problems {
		if p.Kind == "endpoint_down" {
			detail = p.Detail
		}
	}
	if detail != "the health probe fails for 10.0.1.1:8000: "+why {
		t.Fatalf("endpoint_down detail %q", detail)
	}
	for _, r := range st.Rules {
		if r.ServiceID == 1 && r.Endpoints[0].ProbeError != why {
			t.Fatalf("probe_error %q", r.Endpoints[0].ProbeError)
		}
	}
}

// TestEndpointModels: each endpoint shows what discovery read (base models,
// adapters with their parent, when, the last error), and a failed read is a
// model_discovery_failed problem unless an admin took the endpoint out.
func TestEndpointModels(t *testing.T) {
	served := models.Served{Bases: []string{"Qwen/Qwen3-0.6B", "qwen"}, Adapters: map[string]string{"sql-lora": "Qwen/Qwen3-0.6B", "a-lora": "Qwen/Qwen3-0.6B"}}
	tests := []struct {
		name      string
		state     models.EndpointState
		ok        bool
		adminDown bool
		want      *EndpointModels // CheckedAt not compared
		problem   string          // model_discovery_failed detail's tail, "" none
	}{
		{name: "no discovery on the rule", ok: false},
		{name: "first read in flight", ok: true, state: models.EndpointState{},
			want: &EndpointModels{Served: []string{}, Adapters: []models.Adapter{}, CheckedAgeSeconds: -1}},
		{name: "read, with adapters", ok: true, state: models.EndpointState{Served: served, CheckedAt: time.Unix(1_800_000_000, 0)},
			want: &EndpointModels{Served: []string{"Qwen/Qwen3-0.6B", "qwen"},
				Adapters: []models.Adapter{{Name: "a-lora", Parent: "Qwen/Qwen3-0.6B"}, {Name: "sql-lora", Parent: "Qwen/Qwen3-0.6B"}}, CheckedAgeSeconds: 3}},
		{name: "failed after a listing", ok: true, state: models.EndpointState{Served: models.Served{Bases: []string{"m"}}, CheckedAt: time.Unix(1_800_000_001, 0), Err: "status 500"},
			want:    &EndpointModels{Served: []string{"m"}, Adapters: []models.Adapter{}, CheckedAgeSeconds: 2, Error: "status 500"},
			problem: "status 500; routing keeps the models it listed before"},
		{name: "failed, never listed", ok: true, state: models.EndpointState{CheckedAt: time.Unix(1_800_000_001, 0), Err: "connection refused"},
			want:    &EndpointModels{Served: []string{}, Adapters: []models.Adapter{}, CheckedAgeSeconds: 2, Error: "connection refused"},
			problem: "connection refused; until a read succeeds the endpoint is a candidate for every model"},
		{name: "failed on an admin-down endpoint", ok: true, adminDown: true, state: models.EndpointState{CheckedAt: time.Unix(1_800_000_001, 0), Err: "refused"},
			want: &EndpointModels{Served: []string{}, Adapters: []models.Adapter{}, CheckedAgeSeconds: 2, Error: "refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			f.subs[1].Ranks[0].Connected = true
			f.rules[1].Endpoints[0].AdminDown = tc.adminDown
			f.collector.opts.Models = func(service, ep int) (models.EndpointState, bool) {
				if service == 1 && ep == 0 {
					return tc.state, tc.ok
				}
				return models.EndpointState{}, false
			}
			f.tick(0)
			f.now = f.now.Add(3 * time.Second)
			st := f.collector.Snapshot()
			got := st.Rules[0].Endpoints[0].Models
			if (got == nil) != (tc.want == nil) {
				t.Fatalf("models %+v, want %+v", got, tc.want)
			}
			if got != nil {
				if (got.CheckedAt == nil) != (tc.want.CheckedAgeSeconds < 0) {
					t.Errorf("checked_at %v with age %v", got.CheckedAt, got.CheckedAgeSeconds)
				}
				g, w := *got, *tc.want
				g.CheckedAt = nil
				if !reflect.DeepEqual(g, w) {
					t.Errorf("models %+v, want %+v", g, w)
				}
			}
			if st.Rules[0].Endpoints[1].Models != nil {
				t.Errorf("ep 1 shows models without discovery")
			}
			var detail string
			for _, p := range st.Problems {
				if p.Kind == "model_discovery_failed" {
					detail = p.Detail
				}
			}
			if tc.problem == "" && detail != "" || tc.problem != "" && !strings.HasSuffix(detail, tc.problem) {
				t.Fatalf("model_discovery_failed detail %q, want it ending %q", detail, tc.problem)
			}
		})
	}
}
