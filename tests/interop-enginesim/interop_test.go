// Package interopenginesim checks enginesim's KV events with real libzmq:
// a Python subscriber (Debian's python3-zmq, python3-msgpack, python3-cbor2
// under /usr/bin/python3) reads the PUB stream, verifies frames, sequence
// numbers, the payload layout and every block hash recomputed from
// token_ids, and fetches a replay over a DEALER socket.
package interopenginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/enginesim"
	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/internal/testpy"
)

func complete(t *testing.T, e *enginesim.Engine, body map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
}

func ids(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i*7919%150000
	}
	return out
}

func TestPythonSubscriberReadsEnginesimEvents(t *testing.T) {
	testpy.Require(t, "zmq", "msgpack", "cbor2")
	// Each payload layout also runs one replay layout: the current vLLM
	// reply carries the topic (non-empty here, so it cannot pass for the
	// delimiter), the legacy one does not.
	for _, tc := range []struct{ layout, replay, topic string }{{"map", "current", "kv-events"}, {"array", "legacy", ""}} {
		layout := tc.layout
		t.Run(layout+"/"+tc.replay, func(t *testing.T) {
			host := testnet.Host(t)
			const seed = "interop-seed"
			e, err := enginesim.New(enginesim.Config{
				Host: host, Port: 0,
				KVEventsEndpoint: "tcp://" + host + ":0", ReplayEndpoint: "tcp://" + host + ":0",
				EventLayout: layout, NumGPUBlocks: 8, ReplayLayout: tc.replay, EventTopic: tc.topic,
				PythonHashSeed: seed, HashSeedSet: true, HashAlgo: "sha256_cbor",
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, testpy.Python, "subscriber.py", e.EventsEndpoint(), e.ReplayEndpoint(), layout, seed, "16", "200", tc.replay, tc.topic)
			stdout, _ := cmd.StdoutPipe()
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(stdout)
			if !lines.Scan() || lines.Text() != "READY" {
				t.Fatalf("subscriber did not start: %q %s", lines.Text(), stderr.String())
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(e.EventSubscriptions()) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("libzmq subscription never reached the engine")
				}
				time.Sleep(10 * time.Millisecond)
			}

			// Cold, warm (hit + decode-filled blocks), an eviction-heavy
			// prompt in a 7-block cache, a cache_salt request, then a reset.
			complete(t, e, map[string]any{"prompt": ids(10, 40), "max_tokens": 12})
			complete(t, e, map[string]any{"prompt": ids(10, 40), "max_tokens": 3})
			complete(t, e, map[string]any{"prompt": ids(50000, 70), "max_tokens": 2})
			complete(t, e, map[string]any{"prompt": "interop text prompt that spans more than one block of bytes", "max_tokens": 2, "cache_salt": "tenant-a"})
			resp, err := http.Post(e.URL()+"/reset_prefix_cache", "application/json", nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("reset: %v %v", resp, err)
			}
			resp.Body.Close()

			if !lines.Scan() {
				t.Fatalf("no summary from subscriber: %s", stderr.String())
			}
			summary := lines.Text()
			if err := cmd.Wait(); err != nil {
				t.Fatalf("subscriber failed: %v\n%s\n%s", err, summary, stderr.String())
			}
			var res struct {
				OK             bool   `json:"ok"`
				Error          string `json:"error"`
				Batches        int    `json:"batches"`
				Replayed       int    `json:"replayed"`
				BlocksVerified int    `json:"blocks_verified"`
				Removed        int    `json:"BlockRemoved"`
				Salted         int    `json:"salted_blocks"`
			}
			if err := json.Unmarshal([]byte(summary), &res); err != nil || !res.OK {
				t.Fatalf("subscriber: %s (%v)", summary, err)
			}
			if res.BlocksVerified < 8 || res.Removed == 0 || res.Salted != 1 || res.Replayed != res.Batches {
				t.Errorf("summary %s: want ≥8 verified blocks, evictions, one salted block 0 and a full replay", strings.TrimSpace(summary))
			}
			t.Logf("subscriber: %s", summary)
		})
	}
}
