package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/kvhash"
)

func TestUnsetSeed(t *testing.T) {
	prompt := seqIDs(1, 32)
	hashesOf := func(algo string) uint64 {
		h, err := newHasher(Config{HashAlgo: algo, BlockSize: 16, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		return h.AppendHashes(nil, prompt, kvhash.Extra{})[0]
	}
	// sha256 family: vLLM's fixed "vllm-none-hash" seed, reproducible.
	ref, _ := kvhash.New(kvhash.Contract{Algo: kvhash.SHA256CBOR, BlockSize: 16, Seed: kvhash.SeedOf(kvhash.DefaultSHA256Seed)})
	if got, want := hashesOf("sha256_cbor"), ref.AppendHashes(nil, prompt, kvhash.Extra{})[0]; got != want {
		t.Errorf("sha256_cbor unset seed: %d, want %d", got, want)
	}
	// xxhash family: a random NONE_HASH per engine, as vLLM's os.urandom.
	if a, b := hashesOf("xxhash_cbor"), hashesOf("xxhash_cbor"); a == b {
		t.Error("two unseeded xxhash_cbor engines agree; NONE_HASH should be random")
	}
	if _, err := newHasher(Config{HashAlgo: "md5", BlockSize: 16, Logger: quietLogger()}); err == nil {
		t.Error("unknown algorithm accepted")
	}
}

// TestClientDisconnectFreesBlocks aborts a slow stream and checks that the
// engine unpins its blocks and keeps serving.
func TestClientDisconnectFreesBlocks(t *testing.T) {
	e := startEngine(t, Config{DecodeTokensPerS: 50})
	body, _ := json.Marshal(map[string]any{"prompt": seqIDs(1, 40), "max_tokens": 500, "stream": true})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("x-engine-id") != e.ID() {
		t.Error("x-engine-id missing on SSE")
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
	if s, _ := e.Stats(context.Background()); s.Running != 1 || s.UsedBlocks == 0 {
		t.Fatalf("stats while streaming %+v", s)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, _ := e.Stats(context.Background())
		if s.Running == 0 && s.UsedBlocks == 0 {
			if s.CachedBlocks < 2 {
				t.Errorf("prompt blocks lost on abort: %+v", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("abort did not free the request: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	decodeCompletion(t, post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "still serving", "max_tokens": 1}))
}

// TestCloseReleasesSockets restarts engines on the same addresses and ports.
func TestCloseReleasesSockets(t *testing.T) {
	host := testnet.Host(t)
	cfg := Config{Host: host, Logger: quietLogger(), HashSeedSet: true, DecodeTokensPerS: 10,
		KVEventsEndpoint: "tcp://" + host + ":0"}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	port := first.ln.Addr().(interface{ String() string }).String()
	cfg.Port = first.ln.Addr().(*net.TCPAddr).Port
	cfg.KVEventsEndpoint, cfg.ReplayEndpoint = first.EventsEndpoint(), first.ReplayEndpoint()
	// A request in flight when Close runs gets an answer, not a hang.
	done := make(chan int, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 1000})
		resp, err := http.Post(first.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	time.Sleep(50 * time.Millisecond)
	if err := first.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	first.Close() // idempotent
	select {
	case status := <-done:
		if status != http.StatusServiceUnavailable {
			t.Errorf("in-flight request got %d at Close, want 503", status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("in-flight request hung across Close")
	}
	for range 3 {
		e, err := New(cfg)
		if err != nil {
			t.Fatalf("restart on %s: %v", port, err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
