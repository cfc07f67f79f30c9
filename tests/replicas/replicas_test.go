// Package replicas runs two real kvgate daemons (the built binary) on one
// host, with distinct API addresses and VIPs, loading the same --rules-file
// in front of one fleet of simulated engines (internal/enginesim: real HTTP,
// real ZeroMQ KV events). docs/replicas.md describes what it proves.
package replicas

import (
	"bufio"
	"context"
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
	"github.com/kvgate/kvgate/internal/testnet"
)

const model = "Qwen/Qwen3-0.6B"

func repoTokenizerDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../../pkg/tokenizer/testdata/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// startEngines starts n engines of role on <block>.<first>…, sharing one KV
// events port (replay on port + 1000); tune, when given, adjusts each
// engine's config.
func startEngines(t *testing.T, tok enginesim.Tokenizer, block string, first, n int, role enginesim.Role, tune ...func(*enginesim.Config)) ([]*enginesim.Engine, int) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	engines, port, err := enginesim.StartGroup(n, 10,
		func() (int, error) { return testnet.PortPair(t, fmt.Sprintf("%s%d", block, first), 1000), nil },
		func(i, port int) enginesim.Config {
			host := fmt.Sprintf("%s%d", block, first+i)
			c := enginesim.Config{Host: host, ID: fmt.Sprintf("engine-%d", first+i), Model: model, Tokenizer: tok,
				PythonHashSeed: "0", HashSeedSet: true, Role: role,
				KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port), ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", host, port+1000),
				PrefillUsPerToken: 20, TTFTFloor: time.Millisecond, DecodeTokensPerS: 40, Logger: quiet}
			for _, f := range tune {
				f(&c)
			}
			return c
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

func hostPort(t *testing.T, e *enginesim.Engine) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// endpointsYAML lists engines with the given ep_idx values and roles.
func endpointsYAML(t *testing.T, engines []*enginesim.Engine, idx, roles []int) string {
	var b strings.Builder
	for i, e := range engines {
		h, p := hostPort(t, e)
		fmt.Fprintf(&b, "      - {endpointIP: %s, targetPort: %d, weight: 1, ep_role: %d, ep_idx: %d}\n", h, p, roles[i], idx[i])
	}
	return b.String()
}

// daemon is one kvgate process.
type daemon struct {
	api, vip string
	cmd      *exec.Cmd
	log      *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startDaemon(t *testing.T, bin, block, apiHost, vipHost, rulesFile, tokDir string, env ...string) *daemon {
	t.Helper()
	api := fmt.Sprintf("%s%s:%d", block, apiHost, testnet.Port(t, block+apiHost))
	d := &daemon{api: api, vip: block + vipHost, log: &lockedBuffer{}}
	d.cmd = exec.Command(bin, "--api", api, "--rules-file", rulesFile, "--rules-file-interval", "200ms",
		"--state-dir", t.TempDir(), "--tokenizer-dir", tokDir, "--datapath", "userspace", "--decision-header", "--log-level", "warn")
	d.cmd.Env = append(os.Environ(), append([]string{"KVGATE_VIP=" + d.vip, "LLB_KV_NONE_HASH_SEED=0", "LLB_PD_SESSION_HASH=on"}, env...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("daemon %s log:\n%s", d.api, d.log.String())
		}
	})
	waitFor(t, 20*time.Second, "daemon "+api+" serving its file rules", func() bool {
		rules, err := d.rules()
		return err == nil && len(rules) == 2
	})
	return d
}

var client = &http.Client{Timeout: 30 * time.Second}

func (d *daemon) do(method, path, body string) (int, string, error) {
	req, err := http.NewRequest(method, "http://"+d.api+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

type ruleView struct {
	ServiceArguments struct {
		ServiceID int    `json:"service_id"`
		Port      int    `json:"port"`
		Name      string `json:"name"`
	} `json:"serviceArguments"`
	Endpoints []struct {
		EndpointIP string `json:"endpointIP"`
		TargetPort int    `json:"targetPort"`
		EPIdx      int    `json:"ep_idx"`
	} `json:"endpoints"`
	Owner string `json:"owner"`
}

func (d *daemon) rules() ([]ruleView, error) {
	code, body, err := d.do("GET", "/netlox/v1/config/loadbalancer/all", "")
	if err != nil {
		return nil, fmt.Errorf("GET all: %w", err)
	}
	if code != 200 {
		return nil, fmt.Errorf("GET all: status %d", code)
	}
	var list struct {
		LBAttr []ruleView `json:"lbAttr"`
	}
	err = json.Unmarshal([]byte(body), &list)
	return list.LBAttr, err
}

// identity is what must match across replicas: service_id, name and every
// endpoint's address → ep_idx.
func identity(rules []ruleView) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "%d %s:", r.ServiceArguments.ServiceID, r.ServiceArguments.Name)
		for _, e := range r.Endpoints {
			fmt.Fprintf(&b, " %s:%d=%d", e.EndpointIP, e.TargetPort, e.EPIdx)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func waitFor(t *testing.T, bound time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var decisionEP = regexp.MustCompile(`ep=(-?\d+)`)

// complete sends one completion through vip:port and returns the decided
// ep_idx (x-kvgate-decision).
func complete(ctx context.Context, vip string, port int, prompt string, maxTokens int, session string) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("http://%s:%d/v1/completions", vip, port), strings.NewReader(string(body)))
	if err != nil {
		return -1, err
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	resp, err := client.Do(req)
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return -1, fmt.Errorf("status %d", resp.StatusCode)
	}
	m := decisionEP.FindStringSubmatch(resp.Header.Get("x-kvgate-decision"))
	if m == nil {
		return -1, fmt.Errorf("no decision header: %q", resp.Header.Get("x-kvgate-decision"))
	}
	return strconv.Atoi(m[1])
}

// engineRunning reads an engine's own vllm:num_requests_running.
func engineRunning(t *testing.T, e *enginesim.Engine) int {
	t.Helper()
	resp, err := client.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "vllm:num_requests_running") || strings.HasPrefix(line, "vllm:num_requests_waiting") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

func inventoryBlocks(d *daemon, service, ep int) int {
	code, body, err := d.do("GET", fmt.Sprintf("/netlox/v1/config/ai/kv/inventory?service_id=%d&ep_idx=%d", service, ep), "")
	if err != nil || code != 200 {
		return 0
	}
	var inv struct {
		Total int `json:"total"`
	}
	_ = json.Unmarshal([]byte(body), &inv)
	return inv.Total
}
