// Package adversarial sends hostile OpenAI request bodies through the real
// kvgate binary to simulated vLLM engines (internal/enginesim) on loopback:
// every body must get a complete HTTP answer with a clean status, and the
// daemon must be alive, panic-free and serving afterwards. The bounds these
// bodies hit are described in docs/tokenizer.md and docs/chat-templates.md.
package adversarial

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
)

const model = "Qwen/Qwen3-0.6B"

// maxPromptTokens is the daemon's LLB_KV_MAX_PROMPT_TOKENS here: small, so
// the bodies that cross it stay small.
const maxPromptTokens = 4096

// daemon is a running kvgate binary with two KV rules over two engines: one
// rule does not trust request chat templates (the default), one does.
type daemon struct {
	api              string
	plain, trusting  string // base URLs of the two rules
	exited           chan error
	logs             *lockedBuffer
	untrustedService int
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

func startDaemon(t *testing.T) *daemon {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvgate")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kvgate").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tokDir, err := filepath.Abs("../../pkg/tokenizer/testdata/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	staging := t.TempDir()
	if err := os.Symlink(tokDir, filepath.Join(staging, "Qwen__Qwen3-0.6B")); err != nil {
		t.Fatal(err)
	}

	block := testnet.Block(t)
	// The engines use enginesim's byte tokenizer: these tests need answers,
	// not parity, and a megabyte prompt must cost the engine nothing.
	engines, zmq, err := enginesim.StartGroup(2, 10,
		func() (int, error) { return testnet.PortPair(t, block+"11", 1000), nil },
		func(i, port int) enginesim.Config {
			host := fmt.Sprintf("%s%d", block, 11+i)
			return enginesim.Config{
				Host: host, ID: fmt.Sprintf("engine-%d", i), Model: model, PythonHashSeed: "0", HashSeedSet: true,
				KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port), ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", host, port+1000),
				PrefillUsPerToken: 1, TTFTFloor: time.Millisecond, DecodeTokensPerS: 5000,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})

	d := &daemon{api: fmt.Sprintf("http://%s2:%d", block, testnet.Port(t, block+"2")), exited: make(chan error, 1), logs: &lockedBuffer{}}
	cmd := exec.Command(bin, "--api", strings.TrimPrefix(d.api, "http://"), "--state-dir", t.TempDir(), "--tokenizer-dir", staging,
		"--decision-header", "--datapath", "userspace", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "LLB_KV_NONE_HASH_SEED=0", "LLB_KV_MAX_PROMPT_TOKENS="+strconv.Itoa(maxPromptTokens))
	cmd.Stderr = d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-d.exited
	})
	waitFor(t, "the management API", 30*time.Second, func() bool {
		resp, err := http.Get(d.api + "/netlox/v1/config/loadbalancer/all")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})

	var eps []map[string]any
	for _, e := range engines {
		hp := strings.TrimPrefix(e.URL(), "http://")
		i := strings.LastIndexByte(hp, ':')
		p, _ := strconv.Atoi(hp[i+1:])
		eps = append(eps, map[string]any{"endpointIP": hp[:i], "targetPort": p, "weight": 1})
	}
	rule := func(host string, trust bool) (string, int) {
		port := testnet.Port(t, host)
		args := map[string]any{"externalIP": host, "port": port, "protocol": "tcp", "sel": 0, "mode": 4,
			"kvExactMode": 3, "kvZmqPort": zmq, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16}
		if trust {
			args["trustRequestChatTemplate"] = true
		}
		body, _ := json.Marshal(map[string]any{"serviceArguments": args, "endpoints": eps})
		resp, err := http.Post(d.api+"/netlox/v1/config/loadbalancer", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			ServiceID int `json:"service_id"`
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("create rule: %d %s", resp.StatusCode, b)
		}
		return fmt.Sprintf("http://%s:%d", host, port), out.ServiceID
	}
	d.plain, d.untrustedService = rule(block+"1", false)
	d.trusting, _ = rule(block+"3", true)
	return d
}

// send posts body and returns the status and decision reason; a dropped
// connection or a non-JSON answer fails the test.
func (d *daemon) send(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("no answer (daemon alive: %v): %v\n%s", d.alive(), err, d.logs.String())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("answer cut: %v", err)
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") && bytes.HasPrefix(b, []byte("data: "))
	if resp.StatusCode >= 500 || !json.Valid(b) && !sse {
		t.Fatalf("status %d, body %.300q: want a clean JSON answer", resp.StatusCode, b)
	}
	return resp.StatusCode, reasonOf(resp.Header.Get("x-kvgate-decision"))
}

var client = &http.Client{Timeout: 30 * time.Second}

func reasonOf(h string) string {
	for _, part := range strings.Split(h, ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(part), "="); ok && k == "reason" {
			return v
		}
	}
	return ""
}

func (d *daemon) alive() bool {
	select {
	case err := <-d.exited:
		d.exited <- err
		return false
	default:
		return true
	}
}

// metric sums the series of name in the daemon's exposition whose line
// contains every label in match.
func (d *daemon) metric(t *testing.T, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get(d.api + "/netlox/v1/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	total := 0.0
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue next
			}
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		total += v
	}
	return total
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

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestAdversarialBodies: every hostile input of the reliability review, then
// a seeded stream of random OpenAI-shaped bodies, through the real proxy.
func TestAdversarialBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvgate binary")
	}
	d := startDaemon(t)
	long := strings.Repeat("an ordinary prompt of ordinary words ", 8)
	chat := []map[string]any{{"role": "user", "content": long}}
	bomb := `{% set ns = namespace(a=["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]) %}{% for i in range(22) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ ns.a|length }}{{ messages[0].content }}`

	type input struct {
		name   string
		url    string // "" is the plain rule's
		path   string
		body   []byte
		reason string // the decision reason it must take ("" = any)
	}
	var inputs []input
	// The one-packet crash: prompts (and conversations) reqfacts rejects.
	for _, p := range []string{`[]`, `""`, `5`, `true`, `{}`, `[-1]`, `[1.5]`, `[4294967296]`, `[[]]`, `["a",5]`} {
		inputs = append(inputs,
			// A served model: kvgate answers an unserved one 404 model_not_found before the prompt.
			input{"prompt " + p, "", "/v1/completions", []byte(`{"model":"` + model + `","prompt":` + p + `}`), "text_empty"},
			input{"messages " + p, "", "/v1/chat/completions", []byte(`{"model":"` + model + `","messages":` + p + `}`), "text_empty"})
	}
	ids := make([]int, maxPromptTokens+1)
	inputs = append(inputs,
		input{"1 MiB one-word prompt", "", "/v1/completions", mustJSON(map[string]any{"model": model, "prompt": strings.Repeat("a", 1<<20)}), "tokenize"},
		input{"1 MiB whitespace run", "", "/v1/completions", mustJSON(map[string]any{"model": model, "prompt": strings.Repeat(" ", 1<<20)}), "tokenize"},
		input{"more tokens than LLB_KV_MAX_PROMPT_TOKENS", "", "/v1/completions", mustJSON(map[string]any{"model": model, "prompt": strings.Repeat("word ", 2*maxPromptTokens)}), "tokenize"},
		input{"token ids above the limit", "", "/v1/completions", mustJSON(map[string]any{"model": model, "prompt": ids}), "tokenize"},
		input{"request template on a rule that does not trust it", "", "/v1/chat/completions", mustJSON(map[string]any{"model": model, "messages": chat, "chat_template": "{{ messages[0].content }}"}), "tokenize"},
		input{"hostile template on a trusting rule", "trusting", "/v1/chat/completions", mustJSON(map[string]any{"model": model, "messages": chat, "chat_template": bomb}), "tokenize"},
		input{"not JSON", "", "/v1/completions", []byte(`{"model":`), ""},
		input{"deep nesting", "", "/v1/chat/completions", []byte(`{"model":"x","messages":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`), ""},
		input{"ordinary completion", "", "/v1/completions", mustJSON(map[string]any{"model": model, "prompt": long, "max_tokens": 1}), ""},
		input{"ordinary chat", "", "/v1/chat/completions", mustJSON(map[string]any{"model": model, "messages": chat, "max_tokens": 1}), ""},
	)
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			base := d.plain
			if in.url == "trusting" {
				base = d.trusting
			}
			_, reason := d.send(t, base+in.path, in.body)
			if in.reason != "" && reason != in.reason {
				t.Fatalf("decision reason %q, want %q", reason, in.reason)
			}
		})
	}

	t.Run("random OpenAI bodies", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(21, 7))
		for i := range 300 {
			path, body := randomBody(rng)
			base := d.plain
			if i%3 == 0 {
				base = d.trusting
			}
			d.send(t, base+path, body)
		}
	})

	if !d.alive() {
		t.Fatalf("kvgate exited\n%s", d.logs.String())
	}
	if n := d.metric(t, "kvgate_panics_total"); n != 0 {
		t.Fatalf("kvgate_panics_total = %v, want 0\n%s", n, d.logs.String())
	}
	svc := fmt.Sprintf(`service="%d"`, d.untrustedService)
	for _, cause := range []string{"word_bytes", "prompt_tokens", "request_chat_template"} {
		if d.metric(t, "kvgate_kv_skip_total", svc, `cause="`+cause+`"`) == 0 {
			t.Errorf("kvgate_kv_skip_total{cause=%q} stayed 0", cause)
		}
	}
	if status, _ := d.send(t, d.plain+"/v1/completions", mustJSON(map[string]any{"model": model, "prompt": long, "max_tokens": 1})); status != 200 {
		t.Fatalf("after the adversarial bodies: status %d", status)
	}
}
