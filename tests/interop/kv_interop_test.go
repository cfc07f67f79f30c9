// Package interop checks kvgate's KV-event subscriber against real libzmq:
// a vLLM-style publisher under Debian's /usr/bin/python3 (python3-zmq,
// python3-msgpack) sends the golden payloads captured from vLLM's msgspec
// encoder, and the Go inventory must match what those payloads say.
package interop

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/internal/testpy"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/kvevents/ingest"
)

type vectors struct {
	Payloads []struct {
		Name       string          `json:"name"`
		Schema     string          `json:"schema"`
		PayloadHex string          `json:"payload_hex"`
		Decoded    json.RawMessage `json:"decoded"`
	} `json:"payloads"`
	ZMQExchange struct {
		PubFramesHex [][]string `json:"pub_frames_hex"`
	} `json:"zmq_exchange"`
}

func loadVectors(t *testing.T) *vectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/vllm_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// model applies the decoded (JSON) form of a vector to a hash set, without
// kvgate's codec: map events by field name, array events by position.
type model map[uint64]bool

func hashOf(t *testing.T, v any) uint64 {
	t.Helper()
	switch h := v.(type) {
	case json.Number:
		n, ok := new(big.Int).SetString(h.String(), 10)
		if !ok {
			t.Fatalf("bad hash %v", h)
		}
		return new(big.Int).And(n, new(big.Int).SetUint64(^uint64(0))).Uint64() // two's complement for negatives
	case map[string]any:
		b, err := hex.DecodeString(h["$bytes_hex"].(string))
		if err != nil || len(b) < 8 {
			t.Fatalf("bad bytes hash %v", h)
		}
		return new(big.Int).SetBytes(b[len(b)-8:]).Uint64()
	}
	t.Fatalf("hash of type %T", v)
	return 0
}

func (m model) apply(t *testing.T, decoded json.RawMessage) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(decoded)))
	dec.UseNumber()
	var batch []any
	if err := dec.Decode(&batch); err != nil {
		t.Fatal(err)
	}
	for _, ev := range batch[1].([]any) {
		var typ, medium string
		var hashes []any
		switch e := ev.(type) {
		case map[string]any:
			typ, _ = e["type"].(string)
			hashes, _ = e["block_hashes"].([]any)
			medium, _ = e["medium"].(string)
		case []any:
			typ = e[0].(string)
			if len(e) > 1 {
				hashes, _ = e[1].([]any)
			}
			pos := map[string]int{"BlockStored": 6, "BlockRemoved": 2}[typ]
			if pos > 0 && len(e) > pos {
				medium, _ = e[pos].(string)
			}
		}
		if medium != "" && medium != "GPU" {
			continue
		}
		switch typ {
		case "BlockStored":
			for _, h := range hashes {
				m[hashOf(t, h)] = true
			}
		case "BlockRemoved":
			for _, h := range hashes {
				delete(m, hashOf(t, h))
			}
		case "AllBlocksCleared":
			clear(m)
		}
	}
}

func (m model) sorted() []uint64 {
	out := []uint64{}
	for h := range m {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// pyPublisher drives kv_publisher.py.
type pyPublisher struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startPython(t *testing.T, pubEP, replayEP string, args ...string) *pyPublisher {
	t.Helper()
	cmd := exec.Command(testpy.Python, append([]string{"kv_publisher.py", pubEP, replayEP}, args...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPublisher{t: t, cmd: cmd, in: in, out: bufio.NewReader(outPipe)}
	t.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	p.expect("ready")
	return p
}

func (p *pyPublisher) expect(want string) {
	p.t.Helper()
	line, err := p.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		p.t.Fatalf("publisher said %q (%v), want %q", line, err, want)
	}
}

func (p *pyPublisher) send(cmd map[string]any) {
	p.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatal(err)
	}
	p.expect("ok")
}

type counters struct {
	ingest.NopObserver
	restarts chan struct{}
}

func (c *counters) Cleared(_ ingest.EndpointRef, _ int, r ingest.ClearReason) {
	if r == ingest.ClearRestart {
		select {
		case c.restarts <- struct{}{}:
		default:
		}
	}
}

func TestLibzmqPublisherGoldenPayloads(t *testing.T) {
	testpy.Require(t, "zmq", "msgpack")
	v := loadVectors(t)
	ip := testnet.Host(t)
	const offset = ingest.DefaultReplayPortOffset
	port := testnet.PortPair(t, ip, offset)
	py := startPython(t, "tcp://"+net.JoinHostPort(ip, strconv.Itoa(port)), "tcp://"+net.JoinHostPort(ip, strconv.Itoa(port+offset)))

	// Group the vectors by schema; every group is one engine's history.
	var order []string
	groups := map[string][]int{}
	for i, p := range v.Payloads {
		if _, ok := groups[p.Schema]; !ok {
			order = append(order, p.Schema)
		}
		groups[p.Schema] = append(groups[p.Schema], i)
	}
	want := model{}
	seq := 0
	// The first schema's batches predate the subscriber: only the bootstrap
	// replay (Go DEALER against libzmq ROUTER) can deliver them.
	for _, i := range groups[order[0]] {
		py.send(map[string]any{"op": "buf", "seq": seq, "payload_hex": v.Payloads[i].PayloadHex})
		want.apply(t, v.Payloads[i].Decoded)
		seq++
	}

	ix, err := inventory.New(inventory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	obs := &counters{restarts: make(chan struct{}, 1)}
	mgr := ingest.NewManager(ingest.Options{
		ReplayPortOffset: offset,
		DialRetry:        50 * time.Millisecond,
		RebuildDelay:     20 * time.Millisecond,
		Logger:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Observer:         obs,
	})
	t.Cleanup(mgr.Close)
	target := ingest.Target{Service: 1, EPIdx: 0, IP: ip, Port: port, Ranks: 1, Inventory: ix}
	if err := mgr.Reconcile([]ingest.Target{target}); err != nil {
		t.Fatal(err)
	}
	lastSeq := func() (uint64, bool) {
		for _, st := range mgr.Status() {
			return st.Ranks[0].LastSeq, st.Ranks[0].HasSeq
		}
		return 0, false
	}
	waitSeq := func(s int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			if l, ok := lastSeq(); ok && l >= uint64(s) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for seq %d", s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	check := func(step string) {
		t.Helper()
		if got := ix.Snapshot(0); !slices.Equal(got, want.sorted()) {
			t.Fatalf("%s: inventory %v, want %v", step, got, want.sorted())
		}
		t.Logf("%s: %d blocks match", step, len(want))
	}
	waitSeq(seq - 1)
	check("after bootstrap replay of " + order[0])

	// The other schemas go out live, each batch checked on arrival. A batch
	// the SUB socket misses while subscribing is repaired from the replay.
	for _, schema := range order[1:] {
		for _, i := range groups[schema] {
			py.send(map[string]any{"op": "pub", "seq": seq, "payload_hex": v.Payloads[i].PayloadHex})
			want.apply(t, v.Payloads[i].Decoded)
			waitSeq(seq)
			check(v.Payloads[i].Name)
			seq++
		}
	}

	// python3-msgpack packs each integer in its smallest width (uint8, uint16,
	// uint32, uint64, negative int64): all must be stored (the reference drops
	// the uint8/16/32 ones).
	hashes := []any{5, 200, 300, 70000, 1 << 33, json.Number("18446744073709551557"), -2}
	packed := []uint64{5, 200, 300, 70000, 1 << 33, 18446744073709551557, ^uint64(1)}
	for _, layout := range []string{"array", "map"} {
		var ev any = []any{"BlockStored", hashes, nil, []int{1, 2}, 16, nil, "GPU"}
		if layout == "map" {
			ev = map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
				"token_ids": []int{}, "block_size": 16, "lora_id": nil, "medium": nil, "lora_name": nil}
		}
		py.send(map[string]any{"op": "pack", "seq": seq, "batch": []any{1757500000.5, []any{ev}, 0}})
		for _, h := range packed {
			want[h] = true
		}
		waitSeq(seq)
		check("python-msgpack " + layout)
		seq++
		py.send(map[string]any{"op": "pack", "seq": seq, "batch": []any{1757500000.5, []any{[]any{"BlockRemoved", hashes, "GPU"}}, 0}})
		for _, h := range packed {
			delete(want, h)
		}
		waitSeq(seq)
		check("python-msgpack remove " + layout)
		seq++
	}
	// A CPU-tier store does not enter the scored inventory.
	py.send(map[string]any{"op": "pack", "seq": seq, "batch": []any{1.0, []any{[]any{"BlockStored", []any{777}, nil, []any{}, 16, nil, "CPU"}}, 0}})
	waitSeq(seq)
	check("CPU medium")
	if got := ix.MediumBlocks(0)["CPU"]; got != 1 {
		t.Errorf("CPU blocks = %d, want 1", got)
	}

	// Finally the engine restarts: the captured PUB frames (seq 0 and 1,
	// topic "kv-events") go out after the replay buffer is reset.
	py.send(map[string]any{"op": "reset"})
	for i, frames := range v.ZMQExchange.PubFramesHex {
		py.send(map[string]any{"op": "frames", "seq": i, "frames_hex": frames})
	}
	select {
	case <-obs.restarts:
	case <-time.After(15 * time.Second):
		t.Fatal("restart not detected")
	}
	waitSeq(1)
	// Frame 0 is AllBlocksCleared, frame 1 removes a hash that is not there.
	clear(want)
	check("after restart")
}
