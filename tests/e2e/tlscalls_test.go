package e2e

// kvgate's own calls to https-only engines on security-2 rules
// (docs/security.md, "kvgate's own calls to the engines"): the real kvgate,
// enginesim (with vLLM's --ssl-certfile/--ssl-keyfile and --api-key) and
// kvctl binaries.

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testcerts"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/engineclient"
	"github.com/kvgate/kvgate/pkg/preflight"
)

// httpsEngine is one enginesim process speaking https only, with --api-key.
type httpsEngine struct {
	host              string
	httpPort, zmqPort int
	cmd               *exec.Cmd
	exited            chan struct{}
}

func startHTTPSEngine(t *testing.T, bin, host, key string, pair *testcerts.Pair, ca *testcerts.CA) *httpsEngine {
	t.Helper()
	e := &httpsEngine{host: host, httpPort: testnet.Port(t, host), zmqPort: testnet.PortPair(t, host, 1000)}
	dir := t.TempDir()
	if err := pair.Write(dir); err != nil {
		t.Fatal(err)
	}
	e.cmd = exec.Command(bin, "--host", host, "--port", strconv.Itoa(e.httpPort), "--model", model,
		"--tokenizer", repoTokenizerDir(t), "--kv-events-endpoint", fmt.Sprintf("tcp://%s:%d", host, e.zmqPort),
		"--kv-events-topic", "kv-events", "--ttft-floor", "1ms", "--prefill-us-per-token", "5", "--decode-tokens-per-s", "0",
		"--log-level", "warn", "--api-key", key,
		"--ssl-certfile", filepath.Join(dir, "tls.crt"), "--ssl-keyfile", filepath.Join(dir, "tls.key"))
	e.cmd.Env = append(os.Environ(), "PYTHONHASHSEED=0")
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.exited = make(chan struct{})
	go func() { _ = e.cmd.Wait(); close(e.exited) }()
	t.Cleanup(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(10 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.exited
		}
	})
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	waitFor(t, "enginesim https /health", 20*time.Second, func() bool {
		resp, err := c.Get(e.url() + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return e
}

func (e *httpsEngine) url() string {
	return "https://" + net.JoinHostPort(e.host, strconv.Itoa(e.httpPort))
}

// runPreflightJSON runs the preflight through the API and returns its report.
func runPreflightJSON(t *testing.T, api string, id int) preflight.Report {
	t.Helper()
	code, body := apiCall(t, "POST", fmt.Sprintf("%s/netlox/v1/config/ai/kv/preflight?service_id=%d", api, id), "")
	var rep preflight.Report
	if code != 200 || json.Unmarshal([]byte(body), &rep) != nil {
		t.Fatalf("preflight: %d %s", code, body)
	}
	return rep
}

// TestEngineTLSCalls: on a security-2 rule whose engine speaks https only
// and requires a key, kvgate's http probe of a guarded path, its /metrics
// scrape and preflight (every row, the VIP probes over https included) pass
// with backendTokenFile, and a repeated prompt is a KV hit; an engine whose
// certificate another CA signed is down with the reason in kvgate's log,
// the status API and preflight.
func TestEngineTLSCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate, enginesim and kvctl binaries")
	}
	dir := buildCommands(t, "kvgate", "enginesim", "kvctl")
	const key = "sk-https-engine-key"
	block := testnet.Block(t)
	engineCA, err := testcerts.NewCA("engines CA")
	if err != nil {
		t.Fatal(err)
	}
	engineCAFile := filepath.Join(t.TempDir(), "engines.crt")
	if err := engineCA.WriteCA(engineCAFile); err != nil {
		t.Fatal(err)
	}
	goodPair, _ := engineCA.Server("engine", block+"11")
	eng := startHTTPSEngine(t, filepath.Join(dir, "enginesim"), block+"11", key, goodPair, engineCA)
	otherCA, _ := testcerts.NewCA("someone else's CA")
	strangerPair, _ := otherCA.Server("stranger", block+"12")
	stranger := startHTTPSEngine(t, filepath.Join(dir, "enginesim"), block+"12", key, strangerPair, otherCA)

	vipCA, _ := testcerts.NewCA("VIP CA")
	vipCAFile := filepath.Join(t.TempDir(), "vip-ca.crt")
	if err := vipCA.WriteCA(vipCAFile); err != nil {
		t.Fatal(err)
	}
	certDir, keyDir := t.TempDir(), t.TempDir()
	// The file starts with a stale key: the probe must reach the https
	// engine and be refused (the metric only moves on transitions), then
	// pass once the file holds the engine's key.
	keyFile := filepath.Join(keyDir, "engine-key")
	writeKeyFile(t, keyFile, "sk-stale-key", 0o600)
	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	tg, daemon := startGatewayProcess(t, filepath.Join(dir, "kvgate"), api, "--state-dir", t.TempDir(), "--tokenizer-dir", stagingDir(t),
		"--datapath", "userspace", "--decision-header", "--backend-token-dir", keyDir, "--tls-cert-dir", certDir)
	logs := daemon.logs

	vip := block + "1"
	rule := func(e *httpsEngine) (int, int) {
		port := testnet.Port(t, vip)
		pair, _ := vipCA.Server("vip", vip)
		if err := pair.Write(filepath.Join(certDir, fmt.Sprintf("%s_%d", vip, port))); err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(map[string]any{
			"serviceArguments": map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
				"kvExactMode": 3, "kvZmqPort": e.zmqPort, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16,
				"security": 2, "mtls_backend": map[string]any{"verify_server_cert": true, "backend_ca_path": engineCAFile},
				"backendTokenFile": keyFile, "probetype": "http", "probereq": "/v1/models",
				"probeInterval": 1, "probeRetries": 1, "probeTimeout": 2},
			"endpoints": []map[string]any{{"endpointIP": e.host, "targetPort": e.httpPort, "weight": 1}},
		})
		return tg.createRule(t, body), port
	}

	t.Run("https engine with a key: probe, scrape, preflight and KV hits", func(t *testing.T) {
		id, port := rule(eng)
		svc := map[string]string{"service": strconv.Itoa(id), "ep_idx": "0"}
		waitFor(t, "the https probe refused with the stale key", 20*time.Second, func() bool {
			return strings.Contains(logs.String(), "engine refused the token of backendTokenFile")
		})
		waitFor(t, "probe down with the stale key", 10*time.Second, func() bool { return tg.metric(t, "kvgate_endpoint_probe_up", svc) == 0 })
		writeKeyFile(t, keyFile, key, 0o600)
		waitFor(t, "probe up over https with the key", 20*time.Second, func() bool { return tg.metric(t, "kvgate_endpoint_probe_up", svc) == 1 })
		waitFor(t, "the engine scrape over https", 20*time.Second, func() bool {
			return tg.metric(t, "kvgate_endpoint_capacity_blocks", svc) > 0
		})
		waitFor(t, "model discovery over https", 20*time.Second, func() bool {
			return tg.metric(t, "kvgate_endpoint_models", svc) >= 1
		})
		tg.waitSubscribed(t, id, 1)
		rep := runPreflightJSON(t, tg.api, id)
		for _, c := range rep.Checks {
			if c.Result != preflight.Pass {
				t.Errorf("preflight row %s (ep %d): %s: %s (fix: %s)", c.ID, c.EPIdx, c.Result, c.Detail, c.Fix)
			}
		}
		if code, out := runPreflight(t, filepath.Join(dir, "kvctl"), tg.api, id); code != 0 || !strings.Contains(out, "preflight: PASS") {
			t.Errorf("kvctl preflight: exit %d\n%s", code, out)
		}
		client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: vipCA.Pool()}}}
		url := fmt.Sprintf("https://%s/v1/completions", net.JoinHostPort(vip, strconv.Itoa(port)))
		prompt := strings.Repeat("a prompt long enough for several KV blocks over https; ", 8)
		var decision string
		for i := 0; i < 2; i++ {
			body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
			decision = resp.Header.Get("x-kvgate-decision")
			if i == 0 {
				waitFor(t, "the prompt's blocks in the mirror", 10*time.Second, func() bool {
					return tg.metric(t, "loxilb_pd_kv_blocks", svc) > 0
				})
			}
		}
		if score, _ := strconv.Atoi(decisionField(decision, "score")); decisionField(decision, "tier") != "1.5" || score < 1 {
			t.Errorf("the repeated prompt was not a KV hit: decision %q", decision)
		}
	})

	t.Run("an engine certificate from another CA: down, with the reason", func(t *testing.T) {
		id, _ := rule(stranger)
		svc := map[string]string{"service": strconv.Itoa(id), "ep_idx": "0"}
		waitFor(t, "the reason in kvgate's log", 20*time.Second, func() bool {
			return strings.Contains(logs.String(), engineclient.HintUnknownCA)
		})
		waitFor(t, "probe down", 10*time.Second, func() bool { return tg.metric(t, "kvgate_endpoint_probe_up", svc) == 0 })
		waitFor(t, "the reason in the status API", 20*time.Second, func() bool {
			_, body := apiCall(t, "GET", tg.api+"/netlox/v1/status", "")
			return strings.Contains(body, "backend_ca_path") && strings.Contains(body, `"endpoint_down"`)
		})
		rep := runPreflightJSON(t, tg.api, id)
		if rep.Result != preflight.Fail || len(rep.Checks) == 0 || rep.Checks[0].ID != preflight.CheckHealth ||
			rep.Checks[0].Result != preflight.Fail || !strings.Contains(rep.Checks[0].Detail, engineclient.HintUnknownCA) {
			t.Errorf("preflight against the stranger engine: %+v", rep)
		}
	})

	t.Run("security 1: preflight's probe requests go over https to the VIP", func(t *testing.T) {
		engines, zmq := startEngines(t, block, []engineSpec{{role: enginesim.RoleBoth}})
		h, p := engineHostPort(t, engines[0])
		port := testnet.Port(t, vip)
		pair, _ := vipCA.Server("vip", vip)
		if err := pair.Write(filepath.Join(certDir, fmt.Sprintf("%s_%d", vip, port))); err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(map[string]any{
			"serviceArguments": map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
				"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16, "security": 1},
			"endpoints": []map[string]any{{"endpointIP": h, "targetPort": p, "weight": 1}},
		})
		id := tg.createRule(t, body)
		tg.waitSubscribed(t, id, 1)
		rep := runPreflightJSON(t, tg.api, id)
		for _, c := range rep.Checks {
			if c.Result == preflight.Fail || c.ID == preflight.CheckProbe && c.Result != preflight.Pass {
				t.Errorf("preflight row %s (ep %d): %s: %s", c.ID, c.EPIdx, c.Result, c.Detail)
			}
		}
	})

	if strings.Contains(logs.String(), key) {
		t.Fatalf("the engine key reached kvgate's log")
	}
}
