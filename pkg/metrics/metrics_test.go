package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func exposition(t *testing.T, m *Metrics) string {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			b.WriteString("{")
			for _, l := range mt.GetLabel() {
				b.WriteString(l.GetName() + "=\"" + l.GetValue() + "\",")
			}
			b.WriteString("}\n")
		}
	}
	return b.String()
}

func TestLint(t *testing.T) {
	m := New(Options{Version: "test", NoProcessCollectors: true})
	m.InitRule(1)
	problems, err := testutil.GatherAndLint(m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// The reference's names are kept as written even where promlint
		// would prefer another unit suffix.
		if strings.HasPrefix(p.Metric, "loxilb_") {
			continue
		}
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestInitRulePrecreatesNineReasons(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	m.InitRule(3)
	for _, r := range MissReasons {
		if v := testutil.ToFloat64(m.Tier15MissReason.WithLabelValues("3", r)); v != 0 {
			t.Errorf("%s = %v", r, v)
		}
	}
	if n := testutil.CollectAndCount(m.Tier15MissReason); n != 9 {
		t.Errorf("miss reason series = %d, want 9", n)
	}
	if n := testutil.CollectAndCount(m.Tier15Fallthrough, "loxilb_pd_kv_tier15_fallthrough_total"); n != 1 {
		t.Errorf("fallthrough series = %d", n)
	}
}

func TestNamesAndLabels(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	m.InitRule(1)
	m.Tier15Hit(1, 0)
	m.Tier15Spill(1, 2)
	m.Tier15ColdSeed(1, 3)
	m.ZeroHitWatchdogInc(1)
	m.SetKVBlocks(1, 0, 42)
	m.SetEPInfo(1, 0, "192.0.2.1", "192.0.2.1:8000")
	m.SetSubscriberConnected(1, 0, true)
	m.SetRankConnected(1, 0, 0, true)
	m.SubscriberReconnect(1, 0)
	m.SubscriberRecvError(1, 0)
	m.InvCapEvicted(1, 0, 5)
	m.SubscriberGap(1, 0, "small")
	m.SubscriberClear(1, 0, "restart")
	m.SubscriberReplay(1, 0, "ok")
	m.SeqMissingAdd(1, 0, 3)
	m.DecodeError(1, 0)
	m.ObserveTTFB(1, time.Millisecond)
	m.ObserveRequest(1, 0, "2xx", time.Second)
	m.ObserveStage(1, "tokenize", time.Microsecond)
	m.SetDatapath("userspace")
	m.AddSplicedBytes("userspace", 10)
	m.PDInc(m.PDAdmissionShed, 1)
	m.AIPDRequest("Qwen/Qwen3-0.6B", "complete", "success")
	m.SetCircuitBreaker(1, 0, 1, true)
	m.ParityCheckedInc(1, 0)
	m.ParityUncheckedInc(1, 0, "sampled_out")
	m.ParityMismatchInc(1, 0, "seed")
	m.SetParityState(1, 0, -1)
	out := exposition(t, m)
	for _, want := range []string{
		`loxilb_pd_kv_tier15_hits_total{ep_idx="0",service="1",}`,
		`loxilb_pd_kv_tier15_miss_reason_total{reason="shallow",service="1",}`,
		`loxilb_pd_kv_tier15_fallthrough_total{service="1",}`,
		`loxilb_pd_kv_tier15_spills_total{ep_idx="2",service="1",}`,
		`loxilb_pd_kv_tier15_cold_seeds_total{ep_idx="3",service="1",}`,
		`loxilb_pd_kv_zero_hit_watchdog_total{service_id="1",}`,
		`loxilb_pd_kv_blocks{ep_idx="0",service="1",}`,
		`loxilb_pd_ep_info{addr="192.0.2.1:8000",ep="192.0.2.1",ep_idx="0",service="1",}`,
		`loxilb_kv_subscriber_connected{ep="0",service="1",}`,
		`loxilb_kv_subscriber_reconnect_total{ep="0",service="1",}`,
		`loxilb_kv_subscriber_recv_error_total{ep="0",service="1",}`,
		`loxilb_kv_inv_cap_evictions_total{ep="0",service="1",}`,
		`kvgate_kv_subscriber_rank_connected{ep="0",rank="0",service="1",}`,
		`kvgate_kv_subscriber_gaps_total{ep="0",kind="small",service="1",}`,
		`kvgate_kv_subscriber_clears_total{ep="0",reason="restart",service="1",}`,
		`kvgate_kv_subscriber_replays_total{ep="0",outcome="ok",service="1",}`,
		`kvgate_kv_seq_missing_total{ep="0",service="1",}`,
		`kvgate_kv_decode_errors_total{ep="0",service="1",}`,
		`loxilb_proxy_http_ttfb_seconds{service="1",}`,
		`kvgate_requests_total{ep_idx="0",outcome="2xx",service="1",}`,
		`kvgate_request_duration_seconds{ep_idx="0",outcome="2xx",service="1",}`,
		`kvgate_decision_stage_seconds{service="1",stage="tokenize",}`,
		`kvgate_datapath_info{path="userspace",}`,
		`kvgate_spliced_bytes_total{path="userspace",}`,
		`kvgate_spliced_bytes_total{path="sockmap",}`,
		`loxilb_pd_admission_shed_total{service="1",}`,
		`loxilb_ai_pd_requests_total{model="Qwen_Qwen3-0.6B",phase="complete",status="success",}`,
		`loxilb_pd_cb_flips_total{ep_idx="0",service="1",}`,
		`kvgate_build_info{goversion=`,
		`kvgate_kv_parity_checked_total{ep_idx="0",service="1",}`,
		`kvgate_kv_parity_unchecked_total{cause="sampled_out",ep_idx="0",service="1",}`,
		`kvgate_kv_parity_mismatch_total{ep_idx="0",reason="seed",service="1",}`,
		`kvgate_kv_parity_state{ep_idx="0",service="1",}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("exposition lacks %s", want)
		}
	}
}

func TestDeleteEndpointAndRule(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	m.InitRule(1)
	m.InitRule(2)
	m.InitRule(2) // idempotent
	for _, svc := range []int{1, 2} {
		for ep := 0; ep < 2; ep++ {
			m.SetKVBlocks(svc, ep, 10)
			m.SetEPInfo(svc, ep, "10.0.0.1", "10.0.0.1:1")
			m.SetSubscriberConnected(svc, ep, true)
			m.Tier15Hit(svc, ep)
			m.SetParityState(svc, ep, 1)
		}
	}
	m.DeleteEndpoint(1, 1)
	out := exposition(t, m)
	if strings.Contains(out, `loxilb_pd_kv_blocks{ep_idx="1",service="1",}`) || strings.Contains(out, `kvgate_kv_parity_state{ep_idx="1",service="1",}`) || strings.Contains(out, `loxilb_kv_subscriber_connected{ep="1",service="1",}`) ||
		strings.Contains(out, `loxilb_pd_ep_info{addr="10.0.0.1:1",ep="10.0.0.1",ep_idx="1",service="1",}`) {
		t.Errorf("endpoint series survived:\n%s", out)
	}
	if !strings.Contains(out, `loxilb_pd_kv_blocks{ep_idx="0",service="1",}`) || !strings.Contains(out, `loxilb_pd_kv_blocks{ep_idx="1",service="2",}`) {
		t.Error("other endpoints' series were deleted")
	}
	m.DeleteRule(1)
	out = exposition(t, m)
	if strings.Contains(out, `service="1"`) || strings.Contains(out, `service_id="1"`) {
		t.Errorf("rule series survived:\n%s", out)
	}
	if !strings.Contains(out, `service="2"`) {
		t.Error("rule 2 series deleted")
	}
	if v := testutil.ToFloat64(m.Rules); v != 1 {
		t.Errorf("kvgate_rules = %v", v)
	}
}

func TestSplicedBytesSource(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	var bpf uint64 = 1000
	m.SetSplicedBytesSource("sockmap", func() uint64 { return bpf })
	m.AddSplicedBytes("sockmap", 5)
	m.AddSplicedBytes("userspace", 7)
	want := `
# HELP kvgate_spliced_bytes_total Response body bytes moved backend to client, by data path (sockmap read from BPF counters at scrape time).
# TYPE kvgate_spliced_bytes_total counter
kvgate_spliced_bytes_total{path="sockmap"} 1005
kvgate_spliced_bytes_total{path="userspace"} 7
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "kvgate_spliced_bytes_total"); err != nil {
		t.Fatal(err)
	}
	m.SetDatapath("sockmap")
	m.SetDatapath("userspace")
	if n := testutil.CollectAndCount(m.DatapathInfo); n != 1 {
		t.Errorf("datapath_info series = %d, want 1", n)
	}
}

func TestModelLabelBounded(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	if got := m.ModelLabel("meta-llama/Llama 3!"); got != "meta-llama_Llama_3_" {
		t.Errorf("sanitised = %q", got)
	}
	if got := m.ModelLabel(strings.Repeat("a", 100)); len(got) != 64 {
		t.Errorf("len = %d", len(got))
	}
	for i := 0; i < 100; i++ {
		m.ModelLabel("m" + itoa(i))
	}
	if got := m.ModelLabel("brand-new"); got != "other" {
		t.Errorf("after 64 models got %q, want other", got)
	}
	if got := m.ModelLabel("m0"); got != "m0" {
		t.Errorf("known model got %q", got)
	}
}

func TestTwoInstancesIndependent(t *testing.T) {
	a, b := New(Options{}), New(Options{})
	a.Tier15Hit(1, 0)
	if testutil.ToFloat64(b.Tier15Hits.WithLabelValues("1", "0")) != 0 {
		t.Fatal("registries share state")
	}
}

// TestSetEngineFigures: a scrape publishes both figures; a family the
// engine no longer exposes drops its series instead of showing a stale value.
func TestSetEngineFigures(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	tests := []struct {
		blocks, waiting int64
		wantSeries      int // series of the two gauges together
	}{
		{27000, 3, 2},
		{27000, -1, 1},
		{-1, -1, 0},
		{512, 0, 2},
	}
	for _, tc := range tests {
		m.SetEngineFigures(4, 1, tc.blocks, tc.waiting)
		if n := testutil.CollectAndCount(m.EngineCapacity) + testutil.CollectAndCount(m.EngineQueued); n != tc.wantSeries {
			t.Fatalf("blocks %d waiting %d: %d series, want %d", tc.blocks, tc.waiting, n, tc.wantSeries)
		}
		if tc.blocks >= 0 {
			if v := testutil.ToFloat64(m.EngineCapacity.WithLabelValues("4", "1")); v != float64(tc.blocks) {
				t.Fatalf("capacity %v, want %d", v, tc.blocks)
			}
		}
	}
}

// TestMessageCacheGauge: kvgate_extract_messages_cache_bytes reads its
// source at each scrape; a nil Metrics ignores the source.
func TestMessageCacheGauge(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	held := int64(0)
	m.SetMessageCacheSource(func() int64 { return held })
	var nilM *Metrics
	nilM.SetMessageCacheSource(func() int64 { return 1 })
	for _, want := range []int64{0, 4 << 20, 17} {
		held = want
		got, err := testutil.GatherAndCount(m.Registry, "kvgate_extract_messages_cache_bytes")
		if err != nil || got != 1 {
			t.Fatalf("kvgate_extract_messages_cache_bytes: %d series, %v", got, err)
		}
		mfs, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvgate_extract_messages_cache_bytes" {
				if v := mf.GetMetric()[0].GetGauge().GetValue(); v != float64(want) {
					t.Fatalf("gauge %v, want %d", v, want)
				}
			}
		}
	}
}

func TestConversationLookupCounters(t *testing.T) {
	m := New(Options{NoProcessCollectors: true})
	m.ConversationLookup(false, 0)
	m.ConversationLookup(true, 4096)
	m.ConversationLookup(true, 100)
	m.SetConversationCacheSource(func() int { return 12345 })
	var nilM *Metrics
	nilM.ConversationLookup(true, 1) // the router's unit tests run without metrics
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"hits", testutil.ToFloat64(m.convLookups.WithLabelValues("hit")), 2},
		{"misses", testutil.ToFloat64(m.convLookups.WithLabelValues("miss")), 1},
		{"reused bytes", testutil.ToFloat64(m.convReused), 4196},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	n, err := testutil.GatherAndCount(m.Registry, "kvgate_tokenize_prefix_cache_bytes")
	if err != nil || n != 1 {
		t.Fatalf("kvgate_tokenize_prefix_cache_bytes: %d series, %v", n, err)
	}
}
