package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/sglang"
)

// sglangHashVectors are pages hashed by SGLang's own code (see
// pkg/kvhash/testdata/engines and docs/engines.md, "Golden vectors").
type sglangHashVectors struct {
	SGLang []struct {
		Name      string   `json:"name"`
		Tokens    []uint64 `json:"tokens"`
		PageSize  int      `json:"page_size"`
		CacheSalt string   `json:"cache_salt"`
		LoRAName  string   `json:"lora_name"`
		Hashes    []int64  `json:"hashes_i64"`
	} `json:"sglang"`
}

// recvSGLang reads published SGLang batches until want hashes were stored
// or the bound passes, returning the stored hashes in order and the batches.
func recvSGLang(t *testing.T, sub zmq4.Socket, want int) ([]uint64, []*sglang.Batch) {
	t.Helper()
	var stored []uint64
	var batches []*sglang.Batch
	for len(stored) < want {
		ch := make(chan zmq4.Msg, 1)
		errc := make(chan error, 1)
		go func() {
			m, err := sub.Recv()
			if err != nil {
				errc <- err
				return
			}
			ch <- m
		}()
		var m zmq4.Msg
		select {
		case m = <-ch:
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out with %d of %d hashes stored", len(stored), want)
		}
		_, _, payload, err := kvevents.ParseMessage(m.Frames)
		if err != nil {
			t.Fatal(err)
		}
		b, err := sglang.Decode(payload)
		if err != nil {
			t.Fatalf("the payload is not SGLang's: %v", err)
		}
		if b.UnknownFields+b.UnknownEvents+b.BadEvents != 0 {
			t.Fatalf("SGLang's decoder skipped parts of the payload: %+v", b)
		}
		batches = append(batches, b)
		for _, e := range b.Events {
			if e.Type == sglang.BlockStored {
				stored = append(stored, e.BlockHashes...)
			}
		}
	}
	return stored, batches
}

// TestSGLangModeHashVectors: an SGLang-mode engine serving each golden
// vector's tokens (with its cache_salt and LoRA adapter) publishes exactly
// the page hashes SGLang's own hasher produced, in SGLang's payload shape,
// with each page chained to the one before.
func TestSGLangModeHashVectors(t *testing.T) {
	raw, err := os.ReadFile("../../pkg/kvhash/testdata/engines/engine_hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs sglangHashVectors
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, v := range vs.SGLang {
		if len(v.Hashes) == 0 || slices.Max(v.Tokens) >= 1<<31 {
			continue // enginesim's token ids are uint32 below 2^31, like a real vocabulary
		}
		ran++
		t.Run(v.Name, func(t *testing.T) {
			cfg := Config{Engine: EngineSGLang, BlockSize: v.PageSize, DataParallelRank: 2}
			model := DefaultModel
			if v.LoRAName != "" {
				cfg.LoRAModules = []string{v.LoRAName}
				model = v.LoRAName
			}
			e := startEngine(t, cfg)
			sub := subscribe(t, e)
			prompt := make([]uint32, len(v.Tokens))
			for i, tok := range v.Tokens {
				prompt[i] = uint32(tok)
			}
			body := map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}
			if v.CacheSalt != "" {
				body["cache_salt"] = v.CacheSalt
			}
			if r := post(t, e.URL()+"/v1/completions", body); r.status != 200 {
				t.Fatalf("completion: %d %s", r.status, r.body)
			}
			stored, batches := recvSGLang(t, sub, len(v.Hashes))
			for i, h := range v.Hashes {
				if stored[i] != uint64(h) {
					t.Fatalf("page %d: published %d, SGLang hashes %d (all published: %v)", i, int64(stored[i]), h, stored)
				}
			}
			b := batches[0]
			if !b.HasRank || b.AttnDPRank != 2 {
				t.Errorf("attn_dp_rank = %d (set %v), want 2", b.AttnDPRank, b.HasRank)
			}
			first := b.Events[0]
			if first.Shape != sglang.ShapeMap || first.BlockSize != v.PageSize || first.HasParent || first.Medium != sglang.MediumGPU || first.LoRAName != v.LoRAName || first.CacheSalt != v.CacheSalt {
				t.Errorf("first BlockStored %+v: want the map shape, block_size %d, no parent, GPU, lora %q, salt %q", first, v.PageSize, v.LoRAName, v.CacheSalt)
			}
		})
	}
	if ran < 6 {
		t.Fatalf("only %d vectors ran", ran)
	}
}

// TestSGLangModeSurface: the array layout decodes as SGLang's legacy tagged
// arrays, replay answers in the legacy [seq, payload] shape,
// /get_server_info reports the page size, and fields that cannot fit SGLang
// are refused.
func TestSGLangModeSurface(t *testing.T) {
	e := startEngine(t, Config{Engine: EngineSGLang, BlockSize: 4, EventLayout: "array", ReplayEndpoint: ""})
	sub := subscribe(t, e)
	if r := post(t, e.URL()+"/v1/completions", map[string]any{"model": DefaultModel, "prompt": seqIDs(100, 9), "max_tokens": 1}); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	stored, batches := recvSGLang(t, sub, 2)
	if batches[0].Events[0].Shape != sglang.ShapeArray || len(stored) < 2 {
		t.Fatalf("want array-shaped events with 2 pages, got %+v", batches[0])
	}

	// Replay: a DEALER asking from seq 0 gets [ "", seq, payload ] and the end marker.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(e.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(kvevents.ReplayRequest(0)...)); err != nil {
		t.Fatal(err)
	}
	m, err := d.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frames) != 3 {
		t.Fatalf("replay reply has %d frames, want SGLang's 3 (\"\", seq, payload)", len(m.Frames))
	}
	if _, payload, _, err := kvevents.ParseReplayReply(m.Frames); err != nil {
		t.Fatal(err)
	} else if _, err := sglang.Decode(payload); err != nil {
		t.Fatalf("replayed payload: %v", err)
	}

	resp, err := http.Get(e.URL() + "/get_server_info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		PageSize int `json:"page_size"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || info.PageSize != 4 {
		t.Fatalf("/get_server_info page_size %d (err %v), want 4", info.PageSize, err)
	}

	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"vllm hash on sglang", Config{Engine: EngineSGLang, HashAlgo: "sha256_cbor"}},
		{"sglang hash on vllm", Config{HashAlgo: "sha256_sglang"}},
		{"bytes hashes", Config{Engine: EngineSGLang, BytesBlockHashes: true}},
		{"hash block size", Config{Engine: EngineSGLang, BlockSize: 32, HashBlockSize: 16}},
		{"old vllm layout", Config{Engine: EngineSGLang, EventLayout: "array-v0.9"}},
		{"unknown engine", Config{Engine: "tgi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.KVEventsEndpoint, tc.cfg.Logger = "none", quietLogger()
			if e, err := New(tc.cfg); err == nil {
				e.Close()
				t.Fatal("want a config error")
			}
		})
	}
}

// TestSGLangDPRanks: with --dp-size 2 one server runs two attention-DP
// ranks, each with its own cache and PUB socket on the events port + rank,
// publishing its rank in attn_dp_rank; requests alternate between them
// (round robin) and Stats sums both.
func TestSGLangDPRanks(t *testing.T) {
	host := testnet.Host(t)
	port := testnet.PortPair(t, host, 1000)
	e := startEngine(t, Config{
		Host: host, Engine: EngineSGLang, BlockSize: 4, DPSize: 2,
		KVEventsEndpoint: fmt.Sprintf("tcp://%s:%d", host, port),
		ReplayEndpoint:   fmt.Sprintf("tcp://%s:%d", host, port+1000),
	})
	if n := len(e.DPRanks()); n != 1 {
		t.Fatalf("%d extra ranks, want 1", n)
	}
	r1 := e.DPRanks()[0]
	if got, want := r1.EventsEndpoint(), fmt.Sprintf("tcp://%s:%d", host, port+1); got != want {
		t.Fatalf("rank 1 publishes on %s, want %s", got, want)
	}
	if got, want := r1.ReplayEndpoint(), fmt.Sprintf("tcp://%s:%d", host, port+1001); got != want {
		t.Fatalf("rank 1 replays on %s, want %s", got, want)
	}
	subs := []zmq4.Socket{subscribe(t, e), subscribe(t, r1)}
	prompt := seqIDs(500, 8)
	for want := range 2 {
		r := post(t, e.URL()+"/v1/completions", map[string]any{"model": DefaultModel, "prompt": prompt, "max_tokens": 1})
		if r.status != 200 || r.header.Get("x-enginesim-dp-rank") != fmt.Sprint(want) || r.header.Get("x-engine-id") != e.ID() {
			t.Fatalf("request %d: %d rank %q id %q; want rank %d, id %q", want, r.status, r.header.Get("x-enginesim-dp-rank"), r.header.Get("x-engine-id"), want, e.ID())
		}
		stored, batches := recvSGLang(t, subs[want], 2)
		if batches[0].AttnDPRank != want || len(stored) < 2 {
			t.Fatalf("rank %d published attn_dp_rank %d with %d pages", want, batches[0].AttnDPRank, len(stored))
		}
	}
	st, err := e.Stats(context.Background())
	if err != nil || st.CachedBlocks < 4 {
		t.Fatalf("Stats %+v (err %v): want both ranks' pages", st, err)
	}
	for _, bad := range []Config{
		{Engine: EngineSGLang, DPSize: 2, KVEventsEndpoint: "tcp://127.0.0.1:0"},
		{Engine: EngineVLLM, DPSize: 2, KVEventsEndpoint: "tcp://127.0.0.1:5557"},
		{Engine: EngineSGLang, DPSize: 9, KVEventsEndpoint: "tcp://127.0.0.1:5557"},
	} {
		bad.Logger = quietLogger()
		if e, err := New(bad); err == nil {
			e.Close()
			t.Fatalf("config %+v: want an error", bad)
		}
	}
}
