package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/models"
	"github.com/kvgate/kvgate/pkg/status"
)

type fixedStatus struct{ st status.Status }

func (f fixedStatus) Snapshot() status.Status { return f.st }

func statusServer(t *testing.T) string {
	t.Helper()
	one := 1
	st := status.Status{GeneratedAt: time.Unix(1_800_000_000, 0).UTC(), WindowSeconds: 300, Datapath: "sockmap",
		Problems: []status.Problem{{ServiceID: 1, EPIdx: &one, Kind: "subscriber_down", Detail: "no KV-event subscription to 10.0.1.2:8000"}},
		Rules: []status.Rule{{ServiceID: 1, Name: "chat", VIP: "10.0.0.1:8080", Mode: "kv-pool", Parity: "ok", Datapath: "sockmap",
			Contract:  status.Contract{Engine: "vllm", HashAlgo: "sha256_cbor", BlockSize: 16, SeedSet: true},
			HitsTotal: 42, HitsWindow: 12, MissesWindow: map[string]float64{"shallow": 3, "no_worker": 1},
			Endpoints: []status.Endpoint{
				{EPIdx: 0, Addr: "10.0.1.1:8000", Role: "any", Health: "up", Breaker: "closed", Admin: "up", Blocks: 100, HitsTotal: 42,
					Subscriber: &status.Subscriber{Connected: true, Ranks: 1, LastEventAgeSeconds: 3}, HitRate: []float64{0, 1, 2},
					Models: &status.EndpointModels{Served: []string{"Qwen/Qwen3-0.6B"}, Adapters: []models.Adapter{{Name: "sql-lora", Parent: "Qwen/Qwen3-0.6B"}}, CheckedAgeSeconds: 4}},
				{EPIdx: 1, Addr: "10.0.1.2:8000", Role: "any", Health: "down", Breaker: "open", Admin: "up",
					Subscriber: &status.Subscriber{Ranks: 1, LastEventAgeSeconds: -1}, HitRate: []float64{},
					Models: &status.EndpointModels{Served: []string{}, Adapters: []models.Adapter{}, CheckedAgeSeconds: 1, Error: "GET http://10.0.1.2:8000/v1/models: connection refused"}},
			}}}}
	srv := api.New(api.Options{Settings: config.DefaultSettings(), Status: fixedStatus{st}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

func runStatus(t *testing.T, apiURL string, args ...string) (string, int) {
	t.Helper()
	r := &cobra.Command{Use: "kvctl", SilenceUsage: true, SilenceErrors: true}
	r.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &inputError{msg: err.Error()} })
	r.AddCommand(newStatusCmd())
	var out bytes.Buffer
	r.SetOut(&out)
	r.SetErr(io.Discard)
	r.SetArgs(append([]string{"status", "--api-server=" + apiURL}, args...))
	code := 0
	if err := r.Execute(); err != nil {
		code = 1
		var in *inputError
		if errors.As(err, &in) {
			code = 2
		}
	}
	return out.String(), code
}

func TestStatusCommand(t *testing.T) {
	base := statusServer(t)
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		{"table", nil, 0, []string{
			"data path sockmap  window 5m0s",
			"PROBLEMS", "rule 1 ep 1", "subscriber_down",
			"RULE 1 (chat)  10.0.0.1:8080  kv-pool  vllm sha256_cbor block 16 seed set  parity ok",
			"hits 12 (total 42)  misses shallow 3, no_worker 1",
			"connected", "3s ago", "▁▄█", "never",
			"MODELS", "Qwen/Qwen3-0.6B,sql-lora<Qwen/Qwen3-0.6B> (read 4s ago)",
			"none (read 1s ago) READ FAILED: GET http://10.0.1.2:8000/v1/models: connection refused",
		}},
		{"json", []string{"--json"}, 0, []string{`"datapath":"sockmap"`, `"kind":"subscriber_down"`,
			`"models":{"served":["Qwen/Qwen3-0.6B"],"adapters":[{"name":"sql-lora","parent":"Qwen/Qwen3-0.6B"}],"checked_age_seconds":4}`}},
		{"watch twice", []string{"--watch", "--count=2", "--interval=500ms"}, 0, []string{"\x1b[H\x1b[2J"}},
		{"interval too short", []string{"--watch", "--interval=1ms"}, 2, nil},
		{"negative count", []string{"--count=-1"}, 2, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runStatus(t, base, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, s := range tc.contains {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
			if tc.name == "watch twice" && strings.Count(out, "RULE 1") != 2 {
				t.Errorf("want two redraws:\n%s", out)
			}
		})
	}
	t.Run("API down", func(t *testing.T) {
		if _, code := runStatus(t, "http://127.0.0.1:1"); code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
	})
}

func TestModelsColumn(t *testing.T) {
	tests := []struct {
		name string
		in   *status.EndpointModels
		want string
	}{
		{"no discovery", nil, "-"},
		{"first read in flight", &status.EndpointModels{CheckedAgeSeconds: -1}, "reading"},
		{"aliases and adapters", &status.EndpointModels{Served: []string{"a/b", "b"}, Adapters: []models.Adapter{{Name: "x", Parent: "a/b"}}, CheckedAgeSeconds: 65},
			"a/b,b,x<a/b> (read 1m5s ago)"},
		{"failed, kept", &status.EndpointModels{Served: []string{"m"}, CheckedAgeSeconds: 2, Error: "status\n500"}, "m (read 2s ago) READ FAILED: status 500"},
		{"a C1 control in a name", &status.EndpointModels{Served: []string{"a\u009b2Jb"}, CheckedAgeSeconds: 0}, "a?2Jb (read 0s ago)"},
	}
	for _, tc := range tests {
		if got := modelsColumn(tc.in); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
