package harness

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRadixTree(t *testing.T) {
	type op struct {
		insert string
		tenant int
	}
	cases := []struct {
		name        string
		ops         []op
		query       string
		wantMatched int
		wantTenant  int
		wantChars   []int
	}{
		{"empty tree matches nothing", nil, "hello", 0, 0, []int{0, 0}},
		{"exact prefix", []op{{"hello world", 1}}, "hello there", 6, 1, []int{0, 11}},
		{"split keeps both tenants' sizes", []op{{"hello world", 0}, {"hello there", 1}}, "hello world!", 11, 0, []int{11, 11}},
		{"shared node, lowest tenant wins", []op{{"abc", 1}, {"abc", 0}}, "abcd", 3, 0, []int{3, 3}},
		{"partial node match counts its tenant", []op{{"abcdef", 1}}, "abcxyz", 3, 1, []int{0, 6}},
		{"unicode is per character", []op{{"héllo", 0}}, "héllø", 4, 0, []int{5, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newRadixTree(2)
			for _, o := range c.ops {
				tr.insert([]rune(o.insert), o.tenant)
			}
			m, tn := tr.prefixMatch([]rune(c.query))
			if m != c.wantMatched || (m > 0 && tn != c.wantTenant) {
				t.Fatalf("prefixMatch(%q) = %d, %d; want %d, %d", c.query, m, tn, c.wantMatched, c.wantTenant)
			}
			for i, w := range c.wantChars {
				if tr.chars[i] != w {
					t.Fatalf("tenant %d size %d, want %d", i, tr.chars[i], w)
				}
			}
		})
	}
}

func TestRadixTreeEviction(t *testing.T) {
	tr := newRadixTree(2)
	tr.insert([]rune("old prefix one"), 0)
	tr.insert([]rune("new prefix two"), 0)
	tr.insert([]rune("other tenant text"), 1)
	// Tenant 0 holds 28 characters; bound it to 14: the least recently
	// used leaf ("old prefix one") goes, tenant 1 is under the bound and
	// keeps everything.
	tr.evictBySize(17)
	if tr.chars[0] > 17 || tr.chars[1] != 17 {
		t.Fatalf("sizes after eviction %v, want tenant 0 ≤ 17 and tenant 1 = 17", tr.chars)
	}
	if m, _ := tr.prefixMatch([]rune("old prefix one")); m == len("old prefix one") {
		t.Fatal("the least recently used prefix survived eviction")
	}
	if m, tn := tr.prefixMatch([]rune("new prefix two")); m != len("new prefix two") || tn != 0 {
		t.Fatalf("recent prefix lost: matched %d tenant %d", m, tn)
	}
}

func TestSGLangPick(t *testing.T) {
	cfg := SGLangConfig{CacheThreshold: 0.5, BalanceAbsThreshold: 2, BalanceRelThreshold: 1.5}
	cases := []struct {
		name     string
		inflight []int
		seed     map[int]string // tenant → text already routed there
		text     string
		want     int
	}{
		{"balanced, match above threshold goes to the holder", []int{0, 0, 0}, map[int]string{2: "system prompt AAAA question"}, "system prompt AAAA other", 2},
		{"balanced, weak match goes to the smallest tree", []int{0, 0, 0}, map[int]string{0: "xxxxxxxxxxxxxxxxxxxx", 1: "system"}, "system prompt that is long", 2},
		{"imbalanced goes to the shortest queue", []int{5, 0, 9}, map[int]string{2: "system prompt AAAA question"}, "system prompt AAAA other", 1},
		{"abs over but rel under stays cache-aware", []int{10, 7, 8}, map[int]string{0: "system prompt AAAA question"}, "system prompt AAAA other", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newSGLang("t", len(c.inflight), cfg)
			defer p.Close()
			for tn, s := range c.seed {
				p.tree.insert([]rune(s), tn)
			}
			copy(p.inflight, c.inflight)
			if got := p.Pick(&PickRequest{Text: c.text}); got != c.want {
				t.Fatalf("Pick = %d, want %d", got, c.want)
			}
		})
	}
}

func TestRoutingText(t *testing.T) {
	cases := []struct{ path, body, want string }{
		{PathCompletion, `{"prompt":"hello"}`, "hello"},
		{PathChat, `{"messages":[{"role":"system","content":"a"},{"role":"user","content":"b"}]}`, "a b"},
		{PathChat, `not json`, ""},
		{PathCompletion, `{"prompt":[1,2,3]}`, ""},
	}
	for _, c := range cases {
		if got := routingText(c.path, []byte(c.body)); got != c.want {
			t.Errorf("routingText(%s, %s) = %q, want %q", c.path, c.body, got, c.want)
		}
	}
}

func TestResultsResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.csv")
	a := Result{Point: Point{Profile: Profile{Name: "headline"}, Seed: 4, Workload: "capacity", Load: Load{QPS: 30}, Policy: "kvgate"},
		Requests: 80, TTFTp90: 0.25, CachedRatio: 0.6, FirstError: "status 503, busy"}
	b := a
	b.Load, b.Policy = Load{Concurrency: 48}, "round-robin"
	for _, r := range []Result{a, b} {
		if err := AppendResult(path, r); err != nil {
			t.Fatal(err)
		}
	}
	// A run killed mid-write leaves a short last line: it is skipped, so
	// a rerun redoes that point.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("headline,5,capacity,qps,30,kvg")
	f.Close()
	got, err := ReadResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key() != a.Key() || got[1].Key() != b.Key() {
		t.Fatalf("read %d results %+v, want the two complete rows", len(got), got)
	}
	if got[0].TTFTp90 != 0.25 || got[0].FirstError != "status 503; busy" {
		t.Fatalf("row did not round-trip: %+v", got[0])
	}
}

func TestPredictTTFT(t *testing.T) {
	s := EngineState{Running: 4, PendingPrefillTokens: 2000, PredictedTTFTPer1k: 0.04}
	s.Perf.StepFloorS, s.Perf.MaxNumSeqs, s.Perf.DecodeSPerSeq = 0.006, 8, 0.00003
	cold, warm := PredictTTFT(s, 6000), PredictTTFT(s, 1000)
	if !(warm < cold) {
		t.Fatalf("a warm prompt (%.3fs) must beat a cold one (%.3fs)", warm, cold)
	}
	busy := s
	busy.Running, busy.Waiting = 8, 3
	if !(PredictTTFT(busy, 1000) > warm) {
		t.Fatal("full sequence slots must add waiting time")
	}
}

func TestGenerateDeterministic(t *testing.T) {
	s := DefaultShape(40)
	for _, w := range Workloads() {
		a, err := Generate(w, s, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Generate(w, s, 7)
		if len(a) != 40 || len(b) != 40 {
			t.Fatalf("%s: %d requests, want 40", w, len(a))
		}
		for i := range a {
			if string(a[i].Body) != string(b[i].Body) || a[i].Conv != b[i].Conv || a[i].Turn != b[i].Turn {
				t.Fatalf("%s: request %d differs between two generations with one seed", w, i)
			}
		}
	}
	if _, err := Generate("nope", s, 1); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("unknown workload: err %v, want one naming the workloads", err)
	}
	// Turns of a conversation are in order in the trace.
	tr, _ := Generate("chat", s, 3)
	last := map[int]int{}
	for _, r := range tr {
		if prev, ok := last[r.Conv]; ok && r.Turn != prev+1 {
			t.Fatalf("conversation %d: turn %d after %d", r.Conv, r.Turn, prev)
		}
		last[r.Conv] = r.Turn
	}
}

// TestTinyHarness runs the harness end to end at toy size (two policies,
// the capacity workload, fresh fleets) so it keeps working, and checks the
// one property that must hold on any machine: kvgate's routing yields more
// cached prompt tokens than round-robin's. One closed-loop client keeps the
// outcome independent of the machine's speed: no request overlaps another,
// so the load blend never spills and each decision sees every earlier
// request's KV events.
func TestTinyHarness(t *testing.T) {
	env := fleetEnv(t)
	prof := Profile{Name: "ci", PerfModel: "llama3-8b-h100", Engines: 3, NumGPUBlocks: 600, TimeScale: 1}
	shape := DefaultShape(24)
	shape.Groups, shape.SystemWords, shape.QuestionWords, shape.MaxTokens = 6, 600, 60, 8
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	got := map[string]Result{}
	for _, pol := range []string{"kvgate", "round-robin"} {
		r, err := RunPoint(ctx, env, Point{Profile: prof, Seed: 1, Workload: "capacity", Load: Load{Concurrency: 1}, Policy: pol, Shape: shape,
			RequestTimeout: 20 * time.Second, PointTimeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		if r.Errors > 0 || r.Requests != 24 {
			t.Fatalf("%s: %d of %d requests failed: %s", pol, r.Errors, r.Requests, r.FirstError)
		}
		if r.TTFTp50 <= 0 || r.OutTokPerS <= 0 || r.PromptTokens == 0 {
			t.Fatalf("%s: empty measurements %+v", pol, r)
		}
		got[pol] = r
		t.Logf("%s: cached %.1f%% TTFT p50 %.3fs p90 %.3fs", pol, 100*r.CachedRatio, r.TTFTp50, r.TTFTp90)
	}
	if !(got["kvgate"].CachedRatio > got["round-robin"].CachedRatio) {
		t.Fatalf("kvgate cached-token ratio %.3f is not above round-robin's %.3f", got["kvgate"].CachedRatio, got["round-robin"].CachedRatio)
	}
}
