// Package e2e runs kvgate end to end on loopback: simulated vLLM engines
// (internal/enginesim) publishing real ZeroMQ KV events, the gateway (in-process
// or the real binary), and real HTTP clients, including the official OpenAI
// Node SDK.
//
// Every test allocates its own loopback /24 (internal/testnet.Block) and
// ports, so packages and tests can run in parallel.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
)

const model = "Qwen/Qwen3-0.6B"

var (
	tokOnce sync.Once
	tok     enginesim.Tokenizer
	tokErr  error
)

// repoTokenizerDir is the Qwen3 tokenizer committed in the repository.
func repoTokenizerDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../../pkg/tokenizer/testdata/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err != nil {
		t.Fatalf("Qwen3 tokenizer missing: %v", err)
	}
	return d
}

// stagingDir stages the Qwen3 tokenizer under its model slug.
func stagingDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(repoTokenizerDir(t), filepath.Join(dir, "Qwen__Qwen3-0.6B")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func engineTokenizer(t *testing.T) enginesim.Tokenizer {
	t.Helper()
	tokOnce.Do(func() { tok, tokErr = enginesim.LoadTokenizer(repoTokenizerDir(t)) })
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return tok
}

type engineSpec struct {
	role              enginesim.Role
	prefillUsPerToken float64           // 0: 20 µs
	decodeTS          float64           // decode tokens/s (0: fast)
	lora              []string          // LoRA adapters served on the model (--lora-modules)
	engine            string            // enginesim --engine ("": vllm)
	blockSize         int               // --block-size (SGLang's page size); 0: 16
	dpSize            int               // --dp-size (SGLang attention-DP ranks on the events port + rank)
	loraTaskIDs       map[string]uint64 // --lora-task-ids (TensorRT-LLM)
	apiKey            string            // --api-key ("": none)
}

// startEngines starts one engine per spec on <block>.11, .12, …, all
// publishing KV events on the same port (replay on that port + 1000).
func startEngines(t *testing.T, block string, specs []engineSpec) ([]*enginesim.Engine, int) {
	t.Helper()
	tk := engineTokenizer(t)
	engines, port, err := enginesim.StartGroup(len(specs), 10,
		func() (int, error) { return testnet.PortPair(t, block+"11", 1000), nil },
		func(i, port int) enginesim.Config {
			s := specs[i]
			host := fmt.Sprintf("%s%d", block, 11+i)
			dts, us := s.decodeTS, s.prefillUsPerToken
			if dts == 0 {
				dts = 2000
			}
			if us == 0 {
				us = 20
			}
			cfg := enginesim.Config{
				Engine: s.engine, BlockSize: s.blockSize, DPSize: s.dpSize, LoRATaskIDs: s.loraTaskIDs,
				Host: host, ID: fmt.Sprintf("engine-%d", i), Model: model, Tokenizer: tk,
				PythonHashSeed: "0", HashSeedSet: true, Role: s.role, LoRAModules: s.lora,
				KVEventsEndpoint:  fmt.Sprintf("tcp://%s:%d", host, port),
				ReplayEndpoint:    fmt.Sprintf("tcp://%s:%d", host, port+1000),
				PrefillUsPerToken: us, TTFTFloor: time.Millisecond, DecodeTokensPerS: dts,
				Logger: quietLogger(),
			}
			if s.apiKey != "" {
				cfg.APIKeys = []string{s.apiKey}
			}
			if s.engine == enginesim.EngineTRTLLM {
				cfg.KVEventsEndpoint, cfg.ReplayEndpoint = "none", "none" // drained over HTTP
			}
			return cfg
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})
	return engines, port
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func engineHostPort(t *testing.T, e *enginesim.Engine) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// ruleJSON renders a rule body shaped like docs/api.md's example.
func ruleJSON(t *testing.T, vip string, port int, args map[string]any, engines []*enginesim.Engine, roles []int) []byte {
	t.Helper()
	a := map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4}
	for k, v := range args {
		a[k] = v
	}
	var eps []map[string]any
	for i, e := range engines {
		h, p := engineHostPort(t, e)
		ep := map[string]any{"endpointIP": h, "targetPort": p, "weight": 1}
		if roles != nil {
			ep["ep_role"] = roles[i]
		}
		eps = append(eps, ep)
	}
	b, err := json.Marshal(map[string]any{"serviceArguments": a, "endpoints": eps})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// createKVRule creates a rule on vip and a fresh port over engines (roles
// may be nil) and returns its service_id and base URL http://vip:port.
func createKVRule(t *testing.T, tg *testGateway, vip string, engines []*enginesim.Engine, roles []int, args map[string]any) (int, string) {
	t.Helper()
	port := testnet.Port(t, vip)
	id := tg.createRule(t, ruleJSON(t, vip, port, args, engines, roles))
	return id, fmt.Sprintf("http://%s:%d", vip, port)
}

// startMode3 starts one engine per spec, a gateway and a kvExactMode-3 rule
// over the engines on <block>.1 (sha256_cbor, 16-token blocks, extra args
// merged), and waits until every engine's KV events are subscribed. It
// returns the rule's service_id and base URL http://vip:port.
func startMode3(t *testing.T, specs []engineSpec, extra map[string]any) ([]*enginesim.Engine, *testGateway, int, string) {
	t.Helper()
	block := testnet.Block(t)
	engines, zmq := startEngines(t, block, specs)
	tg := startGateway(t, block)
	args := map[string]any{"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}
	for k, v := range extra {
		args[k] = v
	}
	id, base := createKVRule(t, tg, block+"1", engines, nil, args)
	tg.waitSubscribed(t, id, len(engines))
	return engines, tg, id, base
}

// testGateway is an in-process gateway with its API served on loopback.
type testGateway struct {
	g      *gateway.Gateway
	api    string
	access *syncbuf.Buffer
}

// startGateway starts a gateway with default settings, its API on <block>.2
// and the data path chosen automatically.
func startGateway(t *testing.T, block string) *testGateway {
	t.Helper()
	return startGatewayWith(t, block, "2", "", nil)
}

// startPDGateway starts a gateway on the userspace data path with its API on
// <block><apiHost> and settings adjusted by tune (short P/D timeouts,
// fallback, admission caps).
func startPDGateway(t *testing.T, block, apiHost string, tune func(*config.Settings)) *testGateway {
	t.Helper()
	return startGatewayWith(t, block, apiHost, "userspace", tune)
}

func startGatewayWith(t *testing.T, block, apiHost, datapath string, tune func(*config.Settings)) *testGateway {
	t.Helper()
	tg, err := tryStartGateway(t, block, apiHost, datapath, tune)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// tryStartGateway is startGatewayWith returning gateway.New's error (a
// sockmap data path that cannot be set up). The BPF pin instance is named
// after the API address, as cmd/kvgate does, so gateways of parallel tests
// never share pins.
func tryStartGateway(t *testing.T, block, apiHost, datapath string, tune func(*config.Settings)) (*testGateway, error) {
	t.Helper()
	settings := config.DefaultSettings()
	settings.NoneHashSeed, settings.NoneHashSeedSet = "0", true
	if tune != nil {
		tune(&settings)
	}
	access := &syncbuf.Buffer{}
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: stagingDir(t), DecisionHeader: true,
		AccessLog: access, ShutdownGrace: 5 * time.Second, Datapath: datapath, Logger: quietLogger(),
		BPFInstance: "e2e_" + strings.ReplaceAll(block+apiHost, ".", "_")})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", block+apiHost+":0")
	if err != nil {
		g.Shutdown() // releases the data path's pins
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return &testGateway{g: g, api: "http://" + ln.Addr().String(), access: access}, nil
}

// createRule POSTs a rule to the management API and returns its service_id.
func (tg *testGateway) createRule(t *testing.T, body []byte) int {
	t.Helper()
	resp, err := http.Post(tg.api+"/netlox/v1/config/loadbalancer", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result    string `json:"result"`
		ServiceID int    `json:"service_id"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || out.Result != "Success" {
		t.Fatalf("create rule: %d %s", resp.StatusCode, b)
	}
	return out.ServiceID
}

// metric reads one series' value from GET /netlox/v1/metrics; labels are
// matched as a subset. Missing series read as 0.
func (tg *testGateway) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return scrapeSum(t, tg.api+"/netlox/v1/metrics", name, labels)
}

// engineMetric reads one counter from an engine's /metrics (summed over
// its series).
func engineMetric(t *testing.T, e *enginesim.Engine, name string) float64 {
	t.Helper()
	return scrapeSum(t, e.URL()+"/metrics", name, nil)
}

// scrapeSum sums the series of metric name whose labels include labels in
// the Prometheus text exposition at url.
func scrapeSum(t *testing.T, url, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		var lbl string
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			lbl, rest = rest[1:end], rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue
		}
		if !labelsMatch(lbl, labels) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			total += v
		}
	}
	return total
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func labelsMatch(s string, want map[string]string) bool {
	got := map[string]string{}
	for _, m := range labelRE.FindAllStringSubmatch(s, -1) {
		got[m[1]] = m[2]
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitSubscribed waits until n subscribers of the rule are connected.
func (tg *testGateway) waitSubscribed(t *testing.T, service, n int) {
	t.Helper()
	waitFor(t, "KV subscribers", 10*time.Second, func() bool {
		return tg.metric(t, "loxilb_kv_subscriber_connected", map[string]string{"service": strconv.Itoa(service)}) == float64(n)
	})
	time.Sleep(200 * time.Millisecond) // ZeroMQ subscriptions settle after the connect
}

// reply is what a test needs from one proxied response.
type reply struct {
	status   int
	engine   string
	decision string
	body     []byte
	usage    struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
}

func (r reply) cached() int {
	if r.usage.Details == nil {
		return 0
	}
	return r.usage.Details.CachedTokens
}

func post(t *testing.T, url string, body any) reply {
	t.Helper()
	return postWith(t, url, body, nil)
}

// postWith is post that also hands the response headers to hdr.
func postWith(t *testing.T, url string, body any, hdr func(http.Header)) reply {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if hdr != nil {
		hdr(resp.Header)
	}
	r := reply{status: resp.StatusCode, engine: resp.Header.Get("x-engine-id"), decision: resp.Header.Get("x-kvgate-decision")}
	r.body, _ = io.ReadAll(resp.Body)
	var u struct {
		Usage json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(r.body, &u) == nil && len(u.Usage) > 0 {
		_ = json.Unmarshal(u.Usage, &r.usage)
	}
	return r
}

// decisionField reads one field of an x-kvgate-decision header.
func decisionField(h, key string) string {
	for _, part := range strings.Split(h, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && k == key {
			return v
		}
	}
	return ""
}

// accessRecords parses the JSON access-log records written to buf so far.
func accessRecords(buf *syncbuf.Buffer) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}
