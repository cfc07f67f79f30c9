package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"github.com/kvgate/kvgate/internal/testnet"
)

// keyedEngine is one enginesim process started with --api-key, restartable
// on the same ports with another key.
type keyedEngine struct {
	bin, host         string
	httpPort, zmqPort int
	cmd               *exec.Cmd
	exited            chan struct{}
}

func (e *keyedEngine) start(t *testing.T, key string) {
	t.Helper()
	args := []string{"--host", e.host, "--port", strconv.Itoa(e.httpPort), "--model", model,
		"--tokenizer", repoTokenizerDir(t), "--kv-events-endpoint", fmt.Sprintf("tcp://%s:%d", e.host, e.zmqPort),
		"--kv-events-topic", "kv-events", "--ttft-floor", "1ms", "--prefill-us-per-token", "5", "--decode-tokens-per-s", "0",
		"--log-level", "warn", "--api-key", key}
	e.cmd = exec.Command(e.bin, args...)
	e.cmd.Env = append(os.Environ(), "PYTHONHASHSEED=0")
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(e.cmd, e.exited)
	waitFor(t, "enginesim /health", 20*time.Second, func() bool {
		resp, err := http.Get(e.url() + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func (e *keyedEngine) stop() {
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
	e.cmd = nil
}

func (e *keyedEngine) url() string {
	return "http://" + net.JoinHostPort(e.host, strconv.Itoa(e.httpPort))
}

// apiCall sends a JSON body to kvgate's API and returns the status and body.
func apiCall(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// completion posts one completion to url with an optional Authorization.
func completion(t *testing.T, url, auth, prompt string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func writeKeyFile(t *testing.T, path, key string, mode os.FileMode) {
	t.Helper()
	// A new file renamed into place, as a Kubernetes Secret update swaps it.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(key+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// runPreflight runs the real kvctl preflight and returns its exit code and output.
func runPreflight(t *testing.T, kvctlBin, api string, id int) (int, string) {
	t.Helper()
	cmd := exec.Command(kvctlBin, "preflight", "--service-id", strconv.Itoa(id), "--api-server", api)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

// TestEngineRequiresKey runs the real kvgate, enginesim and kvctl binaries:
// an engine started with --api-key behind a rule without backendTokenFile
// is down with the reason in kvgate's log and preflight; a loose token file
// is a 400 naming the field and the mode; with the file the endpoint is up,
// the scrape and preflight pass, and clients are served with their own
// Authorization (kvgate adds none); a key rotation (engine restarted with a
// new key, file replaced) recovers without restarting kvgate.
func TestEngineRequiresKey(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate, enginesim and kvctl binaries")
	}
	dir := buildCommands(t, "kvgate", "enginesim", "kvctl")
	const firstKey, secondKey = "sk-first-engine-key", "sk-second-engine-key"
	block := testnet.Block(t)
	host := block + "11"
	eng := &keyedEngine{bin: filepath.Join(dir, "enginesim"), host: host, httpPort: testnet.Port(t, host), zmqPort: testnet.PortPair(t, host, 1000)}
	eng.start(t, firstKey)
	t.Cleanup(eng.stop)

	api := fmt.Sprintf("%s2:%d", block, testnet.Port(t, block+"2"))
	keyDir := t.TempDir()
	tg, daemon := startGatewayProcess(t, filepath.Join(dir, "kvgate"), api, "--state-dir", t.TempDir(), "--tokenizer-dir", stagingDir(t),
		"--datapath", "userspace", "--decision-header", "--backend-token-dir", keyDir)
	logs := daemon.logs

	vip, vipPort := block+"1", testnet.Port(t, block+"1")
	rulePath := fmt.Sprintf("%s/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%d/protocol/tcp", tg.api, vip, vipPort)
	// vLLM leaves /health open under --api-key; probing a guarded path is
	// how an operator makes the key part of health.
	rule, _ := json.Marshal(map[string]any{
		"serviceArguments": map[string]any{"externalIP": vip, "port": vipPort, "protocol": "tcp", "sel": 0, "mode": 4,
			"kvExactMode": 3, "kvZmqPort": eng.zmqPort, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16,
			"probereq": "/v1/models", "probeInterval": 1, "probeRetries": 1, "probeTimeout": 2},
		"endpoints": []map[string]any{{"endpointIP": host, "targetPort": eng.httpPort, "weight": 1}},
	})
	id := tg.createRule(t, rule)
	svc := map[string]string{"service": strconv.Itoa(id), "ep_idx": "0"}
	probeUp := func() float64 { return tg.metric(t, "kvgate_endpoint_probe_up", svc) }
	vipURL := fmt.Sprintf("http://%s/v1/completions", net.JoinHostPort(vip, strconv.Itoa(vipPort)))

	t.Run("without the token the endpoint is down and says why", func(t *testing.T) {
		waitFor(t, "the 401 reason in kvgate's log", 20*time.Second, func() bool {
			return strings.Contains(logs.String(), "status 401: engine requires a token (backendTokenFile)")
		})
		waitFor(t, "probe down", 10*time.Second, func() bool { return probeUp() == 0 })
		if _, body := apiCall(t, "GET", rulePath, ""); !strings.Contains(body, `"state":"inactive"`) {
			t.Errorf("GET does not show the endpoint inactive: %s", body)
		}
		waitFor(t, "the reason on the status page", 20*time.Second, func() bool {
			_, body := apiCall(t, "GET", tg.api+"/netlox/v1/status", "")
			return strings.Contains(body, "status 401: engine requires a token (backendTokenFile)") && strings.Contains(body, `"endpoint_down"`)
		})
		code, out := runPreflight(t, filepath.Join(dir, "kvctl"), tg.api, id)
		if code != 1 || !strings.Contains(out, "HTTP 401: engine requires a token (backendTokenFile)") || !strings.Contains(out, "backendTokenFile") {
			t.Errorf("preflight without the token: exit %d\n%s", code, out)
		}
	})

	keyFile := filepath.Join(keyDir, "engine-key")
	t.Run("a loose file is a 400 naming the field and the mode", func(t *testing.T) {
		writeKeyFile(t, keyFile, firstKey, 0o644)
		code, body := apiCall(t, "PATCH", rulePath, fmt.Sprintf(`{"serviceArguments":{"backendTokenFile":%q}}`, keyFile))
		if code != 400 || !strings.Contains(body, "serviceArguments.backendTokenFile") || !strings.Contains(body, keyFile+" has mode 0644") {
			t.Fatalf("PATCH with a 0644 file: %d %s", code, body)
		}
	})

	t.Run("a file outside --backend-token-dir is a 400", func(t *testing.T) {
		elsewhere := filepath.Join(t.TempDir(), "elsewhere-key")
		writeKeyFile(t, elsewhere, firstKey, 0o600)
		code, body := apiCall(t, "PATCH", rulePath, fmt.Sprintf(`{"serviceArguments":{"backendTokenFile":%q}}`, elsewhere))
		if code != 400 || !strings.Contains(body, elsewhere+" is outside the backend token directory "+keyDir+" (--backend-token-dir)") {
			t.Fatalf("PATCH with a file outside the directory: %d %s", code, body)
		}
	})

	t.Run("with the token the endpoint is up, scraped and preflight passes", func(t *testing.T) {
		writeKeyFile(t, keyFile, firstKey, 0o600)
		if code, body := apiCall(t, "PATCH", rulePath, fmt.Sprintf(`{"serviceArguments":{"backendTokenFile":%q}}`, keyFile)); code != 200 {
			t.Fatalf("PATCH: %d %s", code, body)
		}
		waitFor(t, "probe up", 20*time.Second, func() bool { return probeUp() == 1 })
		waitFor(t, "the engine scrape", 20*time.Second, func() bool {
			return tg.metric(t, "kvgate_endpoint_capacity_blocks", svc) > 0
		})
		tg.waitSubscribed(t, id, 1)
		code, out := runPreflight(t, filepath.Join(dir, "kvctl"), tg.api, id)
		if code != 0 || !strings.Contains(out, "preflight: PASS") {
			t.Fatalf("preflight with the token: exit %d\n%s", code, out)
		}
	})

	t.Run("clients' own Authorization passes through, and kvgate adds none", func(t *testing.T) {
		if code, body := completion(t, vipURL, "Bearer "+firstKey, "a client with the key"); code != 200 {
			t.Fatalf("a client with the engine's key: %d %s", code, body)
		}
		if code, body := completion(t, vipURL, "", "a client without a key"); code != 401 || body != `{"error":"Unauthorized"}` {
			t.Fatalf("a client without a key got %d %s: kvgate must not lend it the rule's token", code, body)
		}
		if code, _ := completion(t, vipURL, "Bearer sk-wrong", "a client with a wrong key"); code != 401 {
			t.Fatalf("a client with a wrong key got %d", code)
		}
	})

	t.Run("moving backendTokenFile keeps the KV mirror", func(t *testing.T) {
		blocks := func() float64 { return tg.metric(t, "loxilb_pd_kv_blocks", svc) }
		waitFor(t, "the client's blocks in the mirror", 10*time.Second, func() bool { return blocks() > 0 })
		before, connects := blocks(), strings.Count(logs.String(), "kv subscriber: connected")
		moved := filepath.Join(keyDir, "moved-engine-key")
		writeKeyFile(t, moved, firstKey, 0o400)
		if code, body := apiCall(t, "PATCH", rulePath, fmt.Sprintf(`{"serviceArguments":{"backendTokenFile":%q}}`, moved)); code != 200 {
			t.Fatalf("PATCH: %d %s", code, body)
		}
		if code, body := completion(t, vipURL, "Bearer "+firstKey, "after the move"); code != 200 {
			t.Fatalf("a client after the move: %d %s", code, body)
		}
		if got := blocks(); got < before {
			t.Fatalf("the mirror shrank from %v to %v blocks: the subscriber restarted", before, got)
		}
		if n := strings.Count(logs.String(), "kv subscriber: connected"); n != connects {
			t.Fatalf("the subscriber reconnected (%d connects, was %d)", n, connects)
		}
		keyFile = moved
	})

	t.Run("a key rotation recovers without restarting kvgate", func(t *testing.T) {
		pid := daemon.cmd.Process.Pid
		eng.stop()
		eng.start(t, secondKey)
		waitFor(t, "the refusal of the old token in kvgate's log", 20*time.Second, func() bool {
			return strings.Contains(logs.String(), "engine refused the token of backendTokenFile")
		})
		waitFor(t, "probe down after the engine's key changed", 20*time.Second, func() bool { return probeUp() == 0 })
		writeKeyFile(t, keyFile, secondKey, 0o600)
		waitFor(t, "probe up with the new key", 30*time.Second, func() bool { return probeUp() == 1 })
		if code, body := completion(t, vipURL, "Bearer "+secondKey, "after the rotation"); code != 200 {
			t.Fatalf("a client with the new key: %d %s", code, body)
		}
		select {
		case <-daemon.exited:
			t.Fatal("kvgate exited during the rotation")
		default:
		}
		if daemon.cmd.Process.Pid != pid {
			t.Fatal("kvgate restarted")
		}
	})

	if s := logs.String(); strings.Contains(s, firstKey) || strings.Contains(s, secondKey) {
		t.Fatalf("an engine key reached kvgate's log:\n%s", s)
	}
}

// TestPDClientAuthorization: on a P/D rule whose engines require a key, the
// client's own Authorization reaches both legs (the prefill and the decode
// engine), and a client without one is refused by the engine, not served
// with a key kvgate holds.
func TestPDClientAuthorization(t *testing.T) {
	const key = "sk-pd-engine-key"
	topo := pdTopology()
	for i := range topo {
		topo[i].apiKey = key
	}
	engines, tg, id, url := startPD(t, topo, nil, map[string]any{"kvWarmupSec": 0})
	tg.waitSubscribed(t, id, 2)
	prompt := strings.Repeat("the client's own key goes to both legs ", 8)
	if code, body := completion(t, url, "Bearer "+key, prompt); code != 200 {
		t.Fatalf("a client with the key: %d %s", code, body)
	}
	var prefillHandled, decodeHandled float64
	for i, e := range engines {
		n := engineMetric(t, e, "vllm:request_success_total")
		if topo[i].role == pdTopology()[1].role {
			decodeHandled += n
		} else {
			prefillHandled += n
		}
	}
	if prefillHandled < 1 || decodeHandled < 1 {
		t.Fatalf("requests handled: prefill %v, decode %v; want both legs to have served the keyed request", prefillHandled, decodeHandled)
	}
	if code, body := completion(t, url, "", prompt+" again"); code != http.StatusUnauthorized {
		t.Fatalf("a client without the key: %d %s", code, body)
	}
}
