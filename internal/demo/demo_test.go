package demo

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWorkloadIsBoundedAndDeterministic(t *testing.T) {
	a, b := Workload(7), Workload(7)
	if len(a) == 0 || len(a) > 200 {
		t.Fatalf("workload has %d requests, want a bounded non-empty set", len(a))
	}
	if len(a) != len(b) || a[len(a)-1].Messages[1]["content"] != b[len(b)-1].Messages[1]["content"] {
		t.Fatal("the same seed gave different workloads")
	}
	system := a[0].Messages[0]["content"]
	for _, r := range a {
		if r.Messages[0]["content"] != system {
			t.Fatal("every conversation must share the hot system prompt")
		}
	}
}

func TestFindTokenizerDir(t *testing.T) {
	wd, _ := os.Getwd()
	d, err := FindTokenizerDir(wd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := FindTokenizerDir(t.TempDir()); err == nil {
		t.Fatal("found a tokenizer outside the repository")
	}
}

// TestRunPrintsComparison runs the real demo (smaller) and checks the table.
func TestRunPrintsComparison(t *testing.T) {
	if testing.Short() {
		t.Skip("runs engines and a gateway")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out strings.Builder
	if err := Run(ctx, &out, Options{Engines: 3, Concurrency: 4}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"round-robin", "tier-1.5 hits", "hit ratio", "cached-token ratio", "TTFT p50", "TTFT p90", "kvgate"} {
		if !strings.Contains(s, want) {
			t.Fatalf("table lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "failed") {
		t.Fatalf("requests failed:\n%s", s)
	}
}

func TestResultStats(t *testing.T) {
	r := Result{Requests: 4, Hits: 3, PromptTokens: 100, CachedTokens: 25,
		TTFT: []time.Duration{4 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}}
	if r.HitRatio() != 0.75 || r.CachedRatio() != 0.25 {
		t.Fatalf("ratios %v %v", r.HitRatio(), r.CachedRatio())
	}
	if p := r.Percentile(50); p != 2*time.Millisecond {
		t.Fatalf("p50 %v", p)
	}
	if p := r.Percentile(90); p != 4*time.Millisecond {
		t.Fatalf("p90 %v", p)
	}
}

func TestCompareP50(t *testing.T) {
	ms := func(v int) Result { return Result{TTFT: []time.Duration{time.Duration(v) * time.Millisecond}} }
	tests := []struct {
		kv, rr int
		want   string
	}{
		{10, 20, "TTFT p50 2.0x lower than round-robin"},
		{10, 10, "TTFT p50 within 5% of round-robin"},
		{20, 10, "TTFT p50 2.0x higher than round-robin"},
	}
	for _, tc := range tests {
		if got := compareP50(ms(tc.kv), ms(tc.rr)); got != tc.want {
			t.Errorf("kv %dms rr %dms: %q, want %q", tc.kv, tc.rr, got, tc.want)
		}
	}
}
