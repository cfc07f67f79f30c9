package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/state"
	"github.com/spf13/cobra"
)

type staticInventory map[[2]int][]uint64

func (s staticInventory) Snapshot(sid, ep int) (string, []uint64, bool) {
	h, ok := s[[2]int{sid, ep}]
	return "sha256_cbor", h, ok
}

// startAPI runs a real management API (with persistence and metrics) on a loopback listener.
func startAPI(t *testing.T) *httptest.Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := state.Open(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	srv := api.New(api.Options{Settings: config.DefaultSettings(), Store: st, Metrics: m, Gatherer: m.Registry, Log: log,
		Inventory: staticInventory{{1, 0}: {7, 3}}})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts
}

// kvctl runs the API commands in-process on a fresh command tree and returns
// stdout and the exit code main would use.
func kvctl(t *testing.T, apiURL string, args ...string) (string, int, error) {
	t.Helper()
	r := &cobra.Command{Use: "kvctl", SilenceUsage: true, SilenceErrors: true}
	r.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &inputError{msg: err.Error()} })
	r.AddCommand(newAPICommands()...)
	var out bytes.Buffer
	r.SetOut(&out)
	r.SetErr(io.Discard)
	r.SetArgs(append(args, "--api-server="+apiURL))
	err := r.Execute()
	code := 0
	if err != nil {
		code = 1
		var in *inputError
		if errors.As(err, &in) {
			code = 2
		}
	}
	return out.String(), code, err
}

// The loxicmd line of docs/api.md (LoxiLB's guide's), with kvctl in place of loxicmd.
const specLine = `create lb 10.10.10.254 --tcp=8080:8000 --endpoints=192.0.2.1:1,192.0.2.2:1 --mode=fullproxy --select=persist --kv-exact-mode=1 --kv-zmq-port=5557 --kv-hash-algo=sha256_cbor --kv-block-size=16 --kv-warmup=30 --ep-role=prefill,decode`

const specCurlBody = `{
  "serviceArguments": {
    "externalIP": "10.10.10.254",
    "port": 8080,
    "protocol": "tcp",
    "sel": 3,
    "mode": 4,
    "kvExactMode": 1,
    "kvZmqPort": 5557,
    "kvHashAlgo": "sha256_cbor",
    "kvBlockSize": 16,
    "kvWarmupSec": 30
  },
  "endpoints": [
    { "endpointIP": "192.0.2.1", "targetPort": 8000, "weight": 1, "ep_role": 1 },
    { "endpointIP": "192.0.2.2", "targetPort": 8000, "weight": 1, "ep_role": 2 }
  ]
}`

func getAll(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/netlox/v1/config/loadbalancer/all")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestSpecLoxicmdLineEqualsCurlBody(t *testing.T) {
	viaCLI := startAPI(t)
	out, code, err := kvctl(t, viaCLI.URL, strings.Fields(specLine)...)
	if code != 0 || !strings.Contains(out, "service_id 1") {
		t.Fatalf("exit %d %v: %s", code, err, out)
	}
	viaCurl := startAPI(t)
	resp, err := http.Post(viaCurl.URL+"/netlox/v1/config/loadbalancer", "application/json", strings.NewReader(specCurlBody))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("curl body: %v %v", err, resp)
	}
	resp.Body.Close()
	if a, b := getAll(t, viaCLI.URL), getAll(t, viaCurl.URL); a != b {
		t.Fatalf("the loxicmd line and the curl body made different rules:\ncli  %s\ncurl %s", a, b)
	}
}

func TestKvctlAgainstRunningAPI(t *testing.T) {
	ts := startAPI(t)
	run := func(want int, args ...string) string {
		t.Helper()
		out, code, err := kvctl(t, ts.URL, args...)
		if code != want {
			t.Fatalf("kvctl %v: exit %d (want %d), err %v, out %s", args, code, want, err, out)
		}
		if err != nil {
			return err.Error()
		}
		return out
	}
	run(0, strings.Fields(specLine)...)

	table := run(0, "get", "lb")
	for _, want := range []string{"SERVICE_ID", "10.10.10.254", "192.0.2.1", "prefill", "decode", "persist", "fullproxy", "active", "up"} {
		if !strings.Contains(table, want) {
			t.Errorf("get lb lacks %q:\n%s", want, table)
		}
	}
	var list struct {
		LBAttr []lbRule `json:"lbAttr"`
	}
	if err := json.Unmarshal([]byte(run(0, "get", "lb", "--json")), &list); err != nil || len(list.LBAttr) != 1 || list.LBAttr[0].ServiceArguments.ServiceID != 1 {
		t.Fatalf("get lb --json: %v %+v", err, list)
	}

	run(0, "set", "endpoint", "10.10.10.254", "--tcp=8080", "--ep=192.0.2.2:8000", "--admin=down")
	if table := run(0, "get", "lb"); !strings.Contains(table, "down") {
		t.Errorf("admin down not shown:\n%s", table)
	}
	run(0, strings.Fields(specLine)...) // re-running the create line updates the rule and keeps the drain
	if table := run(0, "get", "lb"); !strings.Contains(table, "down") {
		t.Errorf("re-running create lb brought a drained endpoint back:\n%s", table)
	}
	if msg := run(1, "set", "endpoint", "10.10.10.254", "--tcp=8080", "--ep=192.0.2.9:8000", "--admin=down"); !strings.Contains(msg, "API error 404") || !strings.Contains(msg, "192.0.2.9:8000") {
		t.Errorf("unknown endpoint: %s", msg)
	}

	inv := run(0, "get", "kvinventory", "--service-id=1", "--ep-idx=0")
	if strings.TrimSpace(inv) != `{"service_id":1,"ep_idx":0,"hash_algo":"sha256_cbor","blocks":[{"block_idx":0,"hash_uint64":3},{"block_idx":1,"hash_uint64":7}],"total":2}` {
		t.Errorf("kvinventory: %s", inv)
	}
	if s := run(0, "get", "kv-inventory", "--service-id=1", "--ep-idx=0", "--summary"); !strings.Contains(s, "2 blocks") {
		t.Errorf("summary: %s", s)
	}
	if msg := run(1, "get", "kvinventory", "--service-id=1", "--ep-idx=1"); !strings.Contains(msg, "service or endpoint not found") {
		t.Errorf("inventory 404: %s", msg)
	}

	m := run(0, "get", "metrics", "--grep", "loxilb_pd_kv|kv_subscriber_connected")
	if !strings.Contains(m, `loxilb_pd_kv_tier15_miss_reason_total{reason="no_worker",service="1"} 0`) || strings.Contains(m, "kvgate_build_info") {
		t.Errorf("metrics --grep:\n%s", m)
	}
	if all := run(0, "get", "metrics"); !strings.Contains(all, "kvgate_build_info") {
		t.Error("metrics without --grep is not everything")
	}

	// A rule the API refuses: readable message, exit 1.
	msg := run(1, "create", "lb", "10.10.10.9", "--tcp=80:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--kv-exact-mode=2")
	if !strings.Contains(msg, "API error 400") || !strings.Contains(msg, "kvExactMode") || !strings.Contains(msg, "reserved") {
		t.Errorf("400 not readable: %s", msg)
	}

	run(0, "delete", "lb", "10.10.10.254", "--tcp=8080")
	if msg := run(1, "delete", "lb", "10.10.10.254", "--tcp=8080"); !strings.Contains(msg, "API error 404") {
		t.Errorf("second delete: %s", msg)
	}
	run(0, "create", "lb", "10.10.10.9", "--tcp=80:8000", "--endpoints=192.0.2.1:1,[fd00::1]:2", "--mode=4", "--select=rr", "--kv-exact-mode=3", "--kv-hash-algo=xxhash_cbor", "--kv-hash-seed=0")
	if table := run(0, "get", "lb"); !strings.Contains(table, "fd00::1") {
		t.Errorf("ipv6 endpoint missing:\n%s", table)
	}
	run(0, "create", "lb", "10.10.10.9", "--tcp=80:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--kv-exact-mode=3",
		"--kv-hash-algo=sha256_cbor", "--kv-lora-adapters=sql-lora, chat-lora=Qwen/Qwen3-0.6B")
	if s := getAll(t, ts.URL); !strings.Contains(s, `"kvLoraAdapters":["sql-lora","chat-lora=Qwen/Qwen3-0.6B"]`) {
		t.Errorf("--kv-lora-adapters not posted: %s", s)
	}
	run(0, "create", "lb", "10.10.10.7", "--tcp=80:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--kv-exact-mode=3",
		"--kv-engine-type=trtllm", "--kv-lora-adapters=sql-lora", "--kv-lora-task-ids=sql-lora=18446744073709551613")
	if s := getAll(t, ts.URL); !strings.Contains(s, `"kvLoraTaskIds":{"sql-lora":18446744073709551613}`) {
		t.Errorf("--kv-lora-task-ids not posted: %s", s)
	}
	if msg := run(1, "create", "lb", "10.10.10.8", "--tcp=80:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy",
		"--kv-lora-adapters=sql-lora"); !strings.Contains(msg, "API error 400") || !strings.Contains(msg, "kvLoraAdapters") {
		t.Errorf("adapters on a non-KV rule: %s", msg)
	}
	if msg := run(1, "create", "lb", "0.0.0.0", "--tcp=81:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy"); !strings.Contains(msg, "API error 400") || !strings.Contains(msg, "wildcardVip") {
		t.Errorf("wildcard VIP without --wildcard-vip: %s", msg)
	}
	run(0, "create", "lb", "0.0.0.0", "--tcp=81:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--wildcard-vip")
	if s := getAll(t, ts.URL); !strings.Contains(s, `"wildcardVip":true`) {
		t.Errorf("--wildcard-vip not posted: %s", s)
	}
	keyFile := filepath.Join(t.TempDir(), "engine-key")
	if err := os.WriteFile(keyFile, []byte("sk-engine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(0, "create", "lb", "10.10.10.6", "--tcp=80:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--backend-token-file", keyFile)
	if s := getAll(t, ts.URL); !strings.Contains(s, `"backendTokenFile":"`+keyFile+`"`) || strings.Contains(s, "sk-engine") {
		t.Errorf("--backend-token-file not posted (or the key shown): %s", s)
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg := run(1, "create", "lb", "10.10.10.6", "--tcp=80:8000", "--endpoints=192.0.2.1:1", "--mode=fullproxy", "--backend-token-file", keyFile); !strings.Contains(msg, "API error 400") ||
		!strings.Contains(msg, "serviceArguments.backendTokenFile") || !strings.Contains(msg, "has mode 0644") {
		t.Errorf("a loose backend token file: %s", msg)
	}
	run(0, "delete", "lb", "--all")
	if s := getAll(t, ts.URL); strings.TrimSpace(s) != `{"lbAttr":[]}` {
		t.Errorf("delete --all left %s", s)
	}
}

func TestKvctlBadInputExit2(t *testing.T) {
	ts := startAPI(t)
	for _, args := range [][]string{
		{"create", "lb", "10.0.0.1", "--tcp=abc", "--endpoints=10.0.0.2:1"},
		{"create", "lb", "10.0.0.1", "--tcp=80", "--endpoints=10.0.0.2:1"},
		{"create", "lb", "10.0.0.1", "--endpoints=10.0.0.2:1"},
		{"create", "lb", "not-an-ip", "--tcp=80:80"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--endpoints=10.0.0.2"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--endpoints=10.0.0.2:1", "--ep-role=prefill,decode"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--endpoints=10.0.0.2:1", "--ep-role=leader"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--endpoints=10.0.0.2:1", "--nixl-port=1,2"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--mode=weird"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--select=random"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--kv-exact-mode=x"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--kv-exact-mode=3", "--kv-lora-adapters=a,,b"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--kv-exact-mode=3", "--kv-lora-task-ids=a=-1"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--kv-exact-mode=3", "--kv-lora-task-ids=a"},
		{"create", "lb", "10.0.0.1", "--tcp=80:80", "--no-such-flag"},
		{"delete", "lb", "10.0.0.1"},
		{"set", "endpoint", "10.0.0.1", "--tcp=80", "--ep=10.0.0.2:80", "--admin=sideways"},
		{"set", "endpoint", "10.0.0.1", "--tcp=80", "--ep=10.0.0.2", "--admin=up"},
		{"get", "kvinventory", "--ep-idx=0"},
		{"get", "metrics", "--grep", "("},
		{"get"},
	} {
		if out, code, err := kvctl(t, ts.URL, args...); code != 2 {
			t.Errorf("kvctl %v: exit %d (%v) %s, want 2", args, code, err, out)
		}
	}
	if _, code, _ := kvctl(t, "ftp://x", "get", "lb"); code != 2 {
		t.Errorf("bad --api-server: exit %d", code)
	}
}

func TestKvctlAPIUnreachable(t *testing.T) {
	ts := startAPI(t)
	url := ts.URL
	ts.Close()
	_, code, err := kvctl(t, url, "get", "lb")
	if code != 1 || err == nil || !strings.Contains(err.Error(), "cannot reach the kvgate API") {
		t.Fatalf("exit %d: %v", code, err)
	}
}
