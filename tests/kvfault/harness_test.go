// Package kvfault runs KV-event faults against the real kvgate binary and
// real engines (internal/enginesim over real ZeroMQ and HTTP, or raw TCP
// peers for what no engine would send): a publisher that goes silent, a
// hostile ZMTP peer, and an engine restarted with a sequence reset. Each
// test asserts what the inventory holds and that a normal request still
// routes. See docs/ingest.md.
package kvfault

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/testnet"
)

const model = "Qwen/Qwen3-0.6B"

// buildKvgate builds cmd/kvgate once per test binary.
var buildKvgate = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kvfault-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kvgate")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kvgate").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/kvgate: %w\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := buildKvgate(); err == nil {
		_ = os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// daemon is one kvgate process.
type daemon struct {
	api    string
	logs   *syncbuf.Buffer
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

func startDaemon(t *testing.T, block string, env ...string) *daemon {
	t.Helper()
	bin, err := buildKvgate()
	if err != nil {
		t.Fatal(err)
	}
	tokDir := t.TempDir()
	repoTok, _ := filepath.Abs("../../pkg/tokenizer/testdata/qwen3")
	if err := os.Symlink(repoTok, filepath.Join(tokDir, "Qwen__Qwen3-0.6B")); err != nil {
		t.Fatal(err)
	}
	api := net.JoinHostPort(block+"2", strconv.Itoa(testnet.Port(t, block+"2")))
	d := &daemon{api: "http://" + api, logs: &syncbuf.Buffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(bin, "--api", api, "--state-dir", t.TempDir(), "--tokenizer-dir", tokDir,
		"--datapath", "userspace", "--decision-header")
	d.cmd.Env = append(append(os.Environ(), "LLB_KV_NONE_HASH_SEED=0"), env...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("kvgate log:\n%s", d.logs.String())
		}
	})
	waitFor(t, "the management API", 20*time.Second, func() bool {
		d.alive(t)
		resp, err := http.Get(d.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return d
}

// alive fails the test if the process has exited.
func (d *daemon) alive(t *testing.T) {
	t.Helper()
	select {
	case <-d.exited:
		t.Fatalf("kvgate exited: %v\n%s", d.err, lastLines(d.logs.String(), 30))
	default:
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// endpoint is one rule endpoint: its HTTP host:port.
type endpoint struct {
	host string
	port int
}

// createRule creates a kvExactMode-3 rule on <block>.1 over eps, all
// publishing KV events on zmqPort, and returns its service id and base URL.
func (d *daemon) createRule(t *testing.T, block string, zmqPort int, eps []endpoint, extra ...map[string]any) (int, string) {
	t.Helper()
	vip := block + "1"
	port := testnet.Port(t, vip)
	var list []map[string]any
	for _, e := range eps {
		list = append(list, map[string]any{"endpointIP": e.host, "targetPort": e.port, "weight": 1})
	}
	args := map[string]any{"externalIP": vip, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
		"kvExactMode": 3, "kvZmqPort": zmqPort, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}
	for _, m := range extra {
		for k, v := range m {
			args[k] = v
		}
	}
	body, _ := json.Marshal(map[string]any{"serviceArguments": args, "endpoints": list})
	resp, err := http.Post(d.api+"/netlox/v1/config/loadbalancer", "application/json", bytes.NewReader(body))
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
	return out.ServiceID, fmt.Sprintf("http://%s:%d", vip, port)
}

// inventory returns the block hashes kvgate holds for (service, ep).
func (d *daemon) inventory(t *testing.T, service, ep int) []uint64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("%s/netlox/v1/config/ai/kv/inventory?service_id=%d&ep_idx=%d", d.api, service, ep))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Blocks []struct {
			Hash uint64 `json:"hash_uint64"`
		} `json:"blocks"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("inventory %d/%d: %d %s", service, ep, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("inventory %d/%d: %v: %s", service, ep, err, b)
	}
	hs := make([]uint64, len(out.Blocks))
	for i, bl := range out.Blocks {
		hs[i] = bl.Hash
	}
	return hs
}

// metric sums the series of name whose labels include labels.
func (d *daemon) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get(d.api + "/netlox/v1/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
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
		got := map[string]string{}
		for _, m := range labelRE.FindAllStringSubmatch(lbl, -1) {
			got[m[1]] = m[2]
		}
		match := true
		for k, v := range labels {
			match = match && got[k] == v
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil && match {
			total += v
		}
	}
	return total
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// engineConfig is an engine on host: HTTP on httpPort, KV events on zmqPort
// (replay on zmqPort+1000), or no events when zmqPort is 0.
func engineConfig(id, host string, httpPort, zmqPort int) enginesim.Config {
	c := enginesim.Config{
		Host: host, Port: httpPort, ID: id, Model: model, PythonHashSeed: "0", HashSeedSet: true,
		KVEventsEndpoint: "none", PrefillUsPerToken: 1, TTFTFloor: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if zmqPort > 0 {
		c.KVEventsEndpoint = fmt.Sprintf("tcp://%s:%d", host, zmqPort)
		c.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", host, zmqPort+1000)
	}
	return c
}

func startEngine(t *testing.T, c enginesim.Config) *enginesim.Engine {
	t.Helper()
	var e *enginesim.Engine
	var err error
	// A port just released by a closed engine can take a moment to bind again.
	for range 50 {
		if e, err = enginesim.New(c); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// reply is what a test needs from one proxied response.
type reply struct {
	status   int
	engine   string
	decision string
	cached   int
	body     string
}

func (r reply) field(key string) string {
	for _, part := range strings.Split(r.decision, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && k == key {
			return v
		}
	}
	return ""
}

// complete sends a token-id completion through kvgate.
func complete(t *testing.T, base string, prompt []int) reply {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Post(base+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, engine: resp.Header.Get("x-engine-id"), decision: resp.Header.Get("x-kvgate-decision"), body: string(body)}
	var u struct {
		Usage struct {
			Details *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &u) == nil && u.Usage.Details != nil {
		r.cached = u.Usage.Details.CachedTokens
	}
	return r
}

// tokens returns n token ids from base.
func tokens(base, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = base + i
	}
	return out
}

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
