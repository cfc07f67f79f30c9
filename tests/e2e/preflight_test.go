package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// preflightBins builds enginesim and kvctl (once per test binary).
func preflightBins(t *testing.T) (enginesim, kvctl string) {
	t.Helper()
	dir := buildCommands(t, "enginesim", "kvctl")
	return filepath.Join(dir, "enginesim"), filepath.Join(dir, "kvctl")
}

// startEngineProcess runs the enginesim binary on host with args and env,
// publishing KV events on a non-empty topic, and waits for /health.
func startEngineProcess(t *testing.T, bin, host string, env []string, args ...string) (httpPort, zmqPort int) {
	t.Helper()
	httpPort = testnet.Port(t, host)
	zmqPort = testnet.PortPair(t, host, 1000)
	all := append([]string{"--host", host, "--port", strconv.Itoa(httpPort), "--model", model,
		"--tokenizer", repoTokenizerDir(t), "--kv-events-endpoint", fmt.Sprintf("tcp://%s:%d", host, zmqPort),
		"--kv-events-topic", "kv-events", "--ttft-floor", "1ms", "--prefill-us-per-token", "5", "--decode-tokens-per-s", "0",
		"--log-level", "warn"}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), env...)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	url := fmt.Sprintf("http://%s/health", net.JoinHostPort(host, strconv.Itoa(httpPort)))
	waitFor(t, "enginesim /health", 20*time.Second, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return httpPort, zmqPort
}

// startLoggedGateway is an in-process gateway whose log the test reads.
func startLoggedGateway(t *testing.T, block, stagingDir string) (*testGateway, *syncbuf.Buffer) {
	t.Helper()
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	logs := &syncbuf.Buffer{}
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: stagingDir, DecisionHeader: true,
		ShutdownGrace: 2 * time.Second, Datapath: "userspace", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", block+"2:0")
	if err != nil {
		g.Shutdown()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return &testGateway{g: g, api: "http://" + ln.Addr().String()}, logs
}

// TestPreflightNamesEveryMismatch is the parity gate end to end: a real
// enginesim process publishing real ZeroMQ KV events (topic "kv-events"), the
// gateway, and the real kvctl binary. Each misconfiguration must be caught
// by the first request (the probe's), named in the parity metric and log
// where the hashes differ, and make kvctl preflight exit 1; the matched setup
// passes with exit 0.
func TestPreflightNamesEveryMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the enginesim and kvctl binaries")
	}
	enginesimBin, kvctlBin := preflightBins(t)
	cases := []struct {
		name     string
		env      []string
		args     []string
		wrongTok bool     // stage Llama-3's tokenizer under the Qwen3 model
		exit     int      // kvctl's exit code
		failRows []string // check ids that must FAIL
		text     string   // in kvctl's output
		reason   string   // kvgate_kv_parity_mismatch_total reason ("" none)
		logText  string   // in kvgate's log
	}{
		{name: "matched", env: []string{"PYTHONHASHSEED=0"}, exit: 0, text: "preflight: PASS"},
		{name: "seed", env: []string{"PYTHONHASHSEED=1"}, exit: 1, failRows: []string{"parity", "probe"}, reason: "seed",
			text: "hashes with PYTHONHASHSEED=1; kvgate has LLB_KV_NONE_HASH_SEED=0", logText: "PYTHONHASHSEED=1; kvgate has LLB_KV_NONE_HASH_SEED=0"},
		{name: "algo", env: []string{"PYTHONHASHSEED=0"}, args: []string{"--prefix-caching-hash-algo", "xxhash_cbor"}, exit: 1,
			failRows: []string{"metrics", "parity", "probe"}, reason: "algo",
			text: "set kvHashAlgo=xxhash_cbor", logText: "--prefix-caching-hash-algo xxhash_cbor; the rule has kvHashAlgo=sha256_cbor"},
		{name: "block-size", env: []string{"PYTHONHASHSEED=0"}, args: []string{"--block-size", "32"}, exit: 1,
			failRows: []string{"metrics", "parity", "probe"}, reason: "block_size",
			text: "set kvBlockSize=32", logText: "hashes blocks of 32 tokens"},
		{name: "wrong-tokenizer", env: []string{"PYTHONHASHSEED=0"}, wrongTok: true, exit: 1,
			failRows: []string{"tokenizer", "probe"}, text: "stage the tokenizer of " + model},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each case has its own loopback block; most of its time is the probe's bounded wait
			block := testnet.Block(t)
			host := block + "11"
			httpPort, zmq := startEngineProcess(t, enginesimBin, host, tc.env, tc.args...)
			staging := stagingDir(t)
			if tc.wrongTok {
				staging = t.TempDir()
				llama, err := filepath.Abs("../../pkg/tokenizer/testdata/llama3")
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(llama, filepath.Join(staging, "Qwen__Qwen3-0.6B")); err != nil {
					t.Fatal(err)
				}
			}
			tg, logs := startLoggedGateway(t, block, staging)
			vip := block + "1"
			rule, _ := json.Marshal(map[string]any{
				"serviceArguments": map[string]any{"externalIP": vip, "port": testnet.Port(t, vip), "protocol": "tcp", "sel": 0, "mode": 4,
					"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16, "kvWarmupSec": 0},
				"endpoints": []map[string]any{{"endpointIP": host, "targetPort": httpPort, "weight": 1}},
			})
			id := tg.createRule(t, rule)
			tg.waitSubscribed(t, id, 1)

			cmd := exec.Command(kvctlBin, "preflight", "--service-id", strconv.Itoa(id), "--api-server", tg.api)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			out := stdout.String()
			t.Logf("kvctl preflight (exit %d):\n%s%s", code, out, stderr.String())
			if code != tc.exit {
				t.Fatalf("exit %d, want %d", code, tc.exit)
			}
			if !strings.Contains(out, tc.text) {
				t.Fatalf("output does not contain %q", tc.text)
			}
			for _, row := range tc.failRows {
				if !hasRow(out, row, "FAIL") {
					t.Fatalf("no FAIL row %q", row)
				}
			}
			if tc.exit == 0 && strings.Contains(out, "FAIL") {
				t.Fatal("matched setup has a FAIL row")
			}
			if tc.reason != "" {
				// The probe's first request is the one BlockStored that decides.
				waitFor(t, "the mismatch metric", 10*time.Second, func() bool {
					return tg.metric(t, "kvgate_kv_parity_mismatch_total", map[string]string{"service": strconv.Itoa(id), "reason": tc.reason}) >= 1
				})
				if !strings.Contains(logs.String(), tc.logText) {
					t.Fatalf("kvgate's log does not name the fix %q:\n%s", tc.logText, logs.String())
				}
			} else if n := tg.metric(t, "kvgate_kv_parity_mismatch_total", map[string]string{"service": strconv.Itoa(id)}); n != 0 {
				t.Fatalf("%v parity mismatches, want none", n)
			}
			if tc.exit == 0 {
				if n := tg.metric(t, "kvgate_kv_parity_state", map[string]string{"service": strconv.Itoa(id), "ep_idx": "0"}); n != 1 {
					t.Fatalf("kvgate_kv_parity_state %v, want 1", n)
				}
			}
		})
	}
}

// hasRow reports whether kvctl's table has a row of check id with result.
func hasRow(out, id, result string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id && f[2] == result {
			return true
		}
	}
	return false
}

// TestPreflightPDRule runs the preflight (through the API) on the worked
// example's P/D rule: the probe goes through the P/D path, its blocks land on
// a prefill endpoint, and the repeat is a tier-1.5 hit there.
func TestPreflightPDRule(t *testing.T) {
	_, tg, id, _ := startPD(t, pdTopology(), nil, map[string]any{"kvWarmupSec": 0})
	tg.waitSubscribed(t, id, 2)
	resp, err := http.Post(tg.api+"/netlox/v1/config/ai/kv/preflight?service_id="+strconv.Itoa(id), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep struct {
		Result string `json:"result"`
		Checks []struct {
			ID     string `json:"id"`
			EPIdx  int    `json:"ep_idx"`
			Result string `json:"result"`
			Detail string `json:"detail"`
		} `json:"checks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	rows := map[string]int{}
	for _, c := range rep.Checks {
		t.Logf("%-9s %2d %-4s %s", c.ID, c.EPIdx, c.Result, c.Detail)
		rows[c.ID]++
		if c.Result == "fail" {
			t.Errorf("%s ep %d failed: %s", c.ID, c.EPIdx, c.Detail)
		}
		if c.ID == "probe" && (c.Result != "pass" || (c.EPIdx != 0 && c.EPIdx != 2)) {
			t.Errorf("probe %s on ep %d, want a pass on a prefill endpoint", c.Result, c.EPIdx)
		}
	}
	// Health and metrics for all three endpoints; events and parity for the two prefill ones.
	if rows["health"] != 3 || rows["metrics"] != 3 || rows["kv_events"] != 2 || rows["parity"] != 2 || rows["probe"] != 1 || rep.Result != "pass" {
		t.Fatalf("rows %v result %s", rows, rep.Result)
	}
}
