package ingest

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/pkg/inventory"
)

// drainServer is a trtllm-serve stand-in that answers POST /kv_cache_events
// with the scripted bodies in turn, then "[]".
type drainServer struct {
	mu     sync.Mutex
	bodies []string
	status int
	calls  int
	info   string // the /server_info body; "" answers 404, as older builds
	srv    *httptest.Server
}

func startDrainServer(t *testing.T, bodies ...string) *drainServer {
	t.Helper()
	return startDrainServerInfo(t, "", bodies...)
}

func startDrainServerInfo(t *testing.T, info string, bodies ...string) *drainServer {
	t.Helper()
	d := &drainServer{bodies: bodies, status: http.StatusOK, info: info}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if r.Method == http.MethodGet && r.URL.Path == "/server_info" && d.info != "" {
			_, _ = w.Write([]byte(d.info))
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/kv_cache_events" {
			http.NotFound(w, r)
			return
		}
		d.calls++
		if d.status != http.StatusOK {
			w.WriteHeader(d.status)
			return
		}
		body := "[]"
		if len(d.bodies) > 0 {
			body, d.bodies = d.bodies[0], d.bodies[1:]
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *drainServer) hostPort(t *testing.T) (string, int) {
	h, p, err := net.SplitHostPort(strings.TrimPrefix(d.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// served waits until every scripted body went out and one more drain came
// back empty, so everything scripted was applied.
func (d *drainServer) served(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		calls := d.calls
		d.mu.Unlock()
		if calls > n+1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("drained %d times, want more than %d", calls, n+1)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// followDrain starts a Manager polling d for endpoint 0 of a rule with
// kvBlockSize bs and returns the inventory, the recorder and the log.
func followDrain(t *testing.T, d *drainServer, bs int, maxBytes int) (*inventory.Index, *recorder, *syncbuf.Buffer) {
	t.Helper()
	ix, rec, logs, _ := followDrainGran(t, d, bs, maxBytes)
	return ix, rec, logs
}

func followDrainGran(t *testing.T, d *drainServer, bs int, maxBytes int) (*inventory.Index, *recorder, *syncbuf.Buffer, *Granularity) {
	t.Helper()
	ix, err := inventory.New(inventory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	logs := &syncbuf.Buffer{}
	opts := testOptions(rec)
	opts.PollMin, opts.PollMax, opts.MaxDrainBytes = time.Millisecond, 2*time.Millisecond, maxBytes
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	m := NewManager(opts)
	t.Cleanup(m.Close)
	host, port := d.hostPort(t)
	g := NewExactGranularity(bs)
	if err := m.Reconcile([]Target{{Service: 1, EPIdx: 0, IP: host, Port: port, Ranks: 1, Engine: EngineTRTLLM,
		Inventory: ix, Granularity: g}}); err != nil {
		t.Fatal(err)
	}
	return ix, rec, logs, g
}

// storedEv renders a stored event of full 4-token blocks with the given hashes.
func storedEv(id int64, rank *int, hashes ...uint64) string {
	var blocks []string
	for _, h := range hashes {
		blocks = append(blocks, fmt.Sprintf(`{"type":"stored_block","block_hash":%d,"tokens":[%s],"cache_level":0,"priority":35}`, h,
			strings.TrimSuffix(strings.Repeat(`{"type":"unique_token","token_id":1,"token_extra_id":0},`, 4), ",")))
	}
	r := ""
	if rank != nil {
		r = fmt.Sprintf(`,"attention_dp_rank":%d`, *rank)
	}
	return fmt.Sprintf(`{"event_id":%d,"data":{"type":"stored","parent_hash":null,"blocks":[%s]},"window_size":4096%s}`, id, strings.Join(blocks, ","), r)
}

func created(id int64) string {
	return fmt.Sprintf(`{"event_id":%d,"data":{"type":"created","num_blocks_per_cache_level":[64,0]},"window_size":4096}`, id)
}

func list(evs ...string) string { return "[" + strings.Join(evs, ",") + "]" }

func TestTRTLLMDrain(t *testing.T) {
	r1 := 1
	for _, tc := range []struct {
		name   string
		bodies []string
		gpu    []uint64
		clears map[ClearReason]int
		log    string // a fragment the log must hold
		decode int    // decode errors
	}{
		{"store and remove", []string{list(created(0), storedEv(1, nil, 10, 11)), list(`{"event_id":2,"data":{"type":"removed","block_hashes":[10]},"window_size":4096}`)},
			[]uint64{11}, map[ClearReason]int{}, "", 0},
		{"events applied in event_id order", []string{list(storedEv(2, nil, 12), created(0), storedEv(1, nil, 10))},
			[]uint64{10, 12}, map[ClearReason]int{}, "", 0},
		{"gap: another consumer drained ids 2-4", []string{list(created(0), storedEv(1, nil, 10)), list(storedEv(5, nil, 20))},
			[]uint64{20}, map[ClearReason]int{ClearLargeGap: 1}, "another consumer", 0},
		{"restart: a new created event", []string{list(created(0), storedEv(1, nil, 10)), list(created(0), storedEv(1, nil, 30))},
			[]uint64{30}, map[ClearReason]int{ClearRestart: 1}, "(re)created", 0},
		{"restart: ids went back", []string{list(created(0), storedEv(1, nil, 10), storedEv(2, nil, 11), storedEv(3, nil, 12)), list(storedEv(1, nil, 40))},
			[]uint64{40}, map[ClearReason]int{ClearRestart: 1}, "went back", 0},
		{"duplicate id ignored", []string{list(created(0), storedEv(1, nil, 10)), list(storedEv(1, nil, 99), storedEv(2, nil, 11))},
			[]uint64{10, 11}, map[ClearReason]int{}, "", 0},
		{"ranks share one id sequence: no gap", []string{list(created(0), storedEv(1, nil, 10), storedEv(2, &r1, 11), storedEv(3, nil, 12))},
			[]uint64{10, 11, 12}, map[ClearReason]int{}, "", 0},
		{"malformed body clears", []string{list(created(0), storedEv(1, nil, 10)), `[{"event_id":2,"data":{"type":"bogus"}}]`, list(storedEv(3, nil, 13))},
			[]uint64{13}, map[ClearReason]int{ClearLargeGap: 1}, "not applied", 1},
		{"oversized body clears", []string{list(created(0), storedEv(1, nil, 10)), list(storedEv(2, nil, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28)), list(storedEv(3, nil, 14))},
			[]uint64{14}, map[ClearReason]int{ClearLargeGap: 1}, "exceeds", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDrainServer(t, tc.bodies...)
			ix, rec, logs := followDrain(t, d, 4, 4096)
			d.served(t, len(tc.bodies))
			got := ix.Snapshot(0)
			slices.Sort(got)
			if !slices.Equal(got, tc.gpu) {
				t.Errorf("GPU inventory %v, want %v", got, tc.gpu)
			}
			for reason, n := range tc.clears {
				if c := rec.get(func(r *recorder) int { return r.clears[reason] }); c != n {
					t.Errorf("%s clears %d, want %d", reason, c, n)
				}
			}
			if c := rec.get(func(r *recorder) int { return len(r.clears) }); len(tc.clears) == 0 && c != 0 {
				t.Errorf("unexpected clears %v", rec.clears)
			}
			if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log lacks %q:\n%s", tc.log, logs.String())
			}
			if n := rec.get(func(r *recorder) int { return r.decodeErrs }); n != tc.decode {
				t.Errorf("decode errors %d, want %d", n, tc.decode)
			}
			if rec.get(func(r *recorder) int { return b2i(r.connected[0]) }) != 1 {
				t.Error("the endpoint should count as connected while its drain answers")
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestTRTLLMDrainVectors applies TensorRT-LLM's own serialized drains (see
// pkg/kvevents/trtllm/testdata) through the poller: full blocks of cache
// level 0 score, unioned over attention-DP ranks; the partial block is not
// kept; a block moved to the secondary level leaves the GPU inventory.
func TestTRTLLMDrainVectors(t *testing.T) {
	raw, err := os.ReadFile("../trtllm/testdata/trtllm_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs struct {
		Provenance struct {
			HashesByName map[string][]string `json:"hashes_by_name"`
		} `json:"provenance"`
		Cases []struct {
			Name string `json:"name"`
			Body string `json:"body"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	for _, c := range vs.Cases {
		t.Run(c.Name, func(t *testing.T) {
			// The model: fold the events by rank, as the engine's ranks hold them.
			var evs []struct {
				Rank *int `json:"attention_dp_rank"`
				Data struct {
					Type   string `json:"type"`
					Blocks []struct {
						Hash   uint64            `json:"block_hash"`
						Tokens []json.RawMessage `json:"tokens"`
						Level  int               `json:"cache_level"`
					} `json:"blocks"`
					Hashes []uint64 `json:"block_hashes"`
					Hash   uint64   `json:"block_hash"`
					Level  *struct {
						New int `json:"new_value"`
					} `json:"cache_level"`
				} `json:"data"`
			}
			if err := json.Unmarshal([]byte(c.Body), &evs); err != nil {
				t.Fatal(err)
			}
			held := map[uint64]map[int]bool{}
			for _, e := range evs {
				r := 0
				if e.Rank != nil {
					r = *e.Rank
				}
				switch e.Data.Type {
				case "stored":
					for _, b := range e.Data.Blocks {
						if len(b.Tokens) == 32 && b.Level == 0 {
							if held[b.Hash] == nil {
								held[b.Hash] = map[int]bool{}
							}
							held[b.Hash][r] = true
						}
					}
				case "removed":
					for _, h := range e.Data.Hashes {
						delete(held[h], r)
					}
				case "updated":
					if e.Data.Level != nil && e.Data.Level.New != 0 {
						delete(held[e.Data.Hash], r)
					}
				}
			}
			var want []uint64
			for h, ranks := range held {
				if len(ranks) > 0 {
					want = append(want, h)
				}
			}
			slices.Sort(want)
			d := startDrainServer(t, c.Body)
			ix, _, _ := followDrain(t, d, 32, 1<<20)
			d.served(t, 1)
			got := ix.Snapshot(0)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("GPU inventory %v, want %v", got, want)
			}
		})
	}
}

// TestTRTLLMDrainUnreachable: an endpoint whose drain fails is not
// connected, and a tokens_per_block other than kvBlockSize is reported
// unusable rather than stored.
func TestTRTLLMDrainUnreachable(t *testing.T) {
	d := startDrainServer(t)
	d.mu.Lock()
	d.status = http.StatusServiceUnavailable
	d.mu.Unlock()
	_, rec, logs := followDrain(t, d, 4, 4096)
	d.served(t, 1)
	if rec.get(func(r *recorder) int { return b2i(r.connected[0]) }) != 0 {
		t.Fatal("an endpoint whose drain answers 503 must not count as connected")
	}
	if !strings.Contains(logs.String(), "HTTP 503") {
		t.Fatalf("log lacks the HTTP status:\n%s", logs.String())
	}

	// 8-token blocks behind kvBlockSize 4.
	body := strings.ReplaceAll(list(created(0), storedEv(1, nil, 10, 11)), `{"type":"unique_token","token_id":1,"token_extra_id":0}`,
		`{"type":"unique_token","token_id":1,"token_extra_id":0},{"type":"unique_token","token_id":2,"token_extra_id":0}`)
	d2 := startDrainServer(t, body)
	ix, _, _ := followDrain(t, d2, 4, 1<<20)
	d2.served(t, 1)
	if n := ix.Blocks(0); n != 0 {
		t.Fatalf("%d blocks of the wrong size stored", n)
	}
}

// TestTRTLLMServerInfo: /server_info's kv_cache_hash_algo and
// tokens_per_block decide whether the endpoint can be scored, before any
// block is drained.
func TestTRTLLMServerInfo(t *testing.T) {
	body := list(created(0), storedEv(1, nil, 10))
	for _, tc := range []struct {
		name       string
		info       string
		blocks     int
		refused    bool
		badBlock   bool
		logFragmnt string
	}{
		{"v1 block key", `{"tokens_per_block":4,"kv_cache_hash_algo":"v1_block_key"}`, 1, false, false, ""},
		{"auto", `{"tokens_per_block":4,"kv_cache_hash_algo":"auto"}`, 1, false, false, ""},
		{"older build without the fields", `{"model":"m"}`, 1, false, false, ""},
		{"v2 sha256 is refused", `{"tokens_per_block":4,"kv_cache_hash_algo":"v2_sha256"}`, 0, true, false, "not v1_block_key"},
		{"tokens_per_block 32 behind kvBlockSize 4", `{"tokens_per_block":32,"kv_cache_hash_algo":"v1_block_key"}`, 1, false, true, "tokens_per_block is not kvBlockSize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDrainServerInfo(t, tc.info, body)
			ix, _, logs, g := followDrainGran(t, d, 4, 1<<20)
			d.served(t, 1)
			if n := ix.Blocks(0); n != tc.blocks {
				t.Errorf("%d blocks, want %d", n, tc.blocks)
			}
			if algo, bad := g.Refused(); bad != tc.refused || (bad && algo != "v2_sha256") {
				t.Errorf("Refused() = %q, %v; want %v", algo, bad, tc.refused)
			}
			if _, bad := g.Unusable(); bad != tc.badBlock {
				t.Errorf("Unusable() = %v, want %v", bad, tc.badBlock)
			}
			if tc.logFragmnt != "" && !strings.Contains(logs.String(), tc.logFragmnt) {
				t.Errorf("log lacks %q:\n%s", tc.logFragmnt, logs.String())
			}
		})
	}
}

// TestTRTLLMOneDrainer: two rules over one TensorRT-LLM endpoint get one
// poller (the one already running), since the drain has one consumer; the
// other is reported, and takes over once the first rule is gone.
func TestTRTLLMOneDrainer(t *testing.T) {
	d := startDrainServer(t)
	host, port := d.hostPort(t)
	ix1, _ := inventory.New(inventory.Options{})
	ix2, _ := inventory.New(inventory.Options{})
	m := NewManager(testOptions(newRecorder()))
	t.Cleanup(m.Close)
	a := Target{Service: 2, EPIdx: 0, IP: host, Port: port, Ranks: 1, Engine: EngineTRTLLM, Inventory: ix1}
	b := Target{Service: 1, EPIdx: 0, IP: host, Port: port, Ranks: 1, Engine: EngineTRTLLM, Inventory: ix2}
	if err := m.Reconcile([]Target{a}); err != nil {
		t.Fatal(err)
	}
	err := m.Reconcile([]Target{a, b})
	if err == nil || !strings.Contains(err.Error(), "one consumer") || !strings.Contains(err.Error(), "1/") {
		t.Fatalf("second drainer of one endpoint: err %v, want it refused", err)
	}
	if st := m.Status(); len(st) != 1 || st[0].Service != 2 {
		t.Fatalf("running %+v, want service 2's poller only (it was first)", st)
	}
	if err := m.Reconcile([]Target{b}); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); len(st) != 1 || st[0].Service != 1 {
		t.Fatalf("running %+v, want service 1's poller", st)
	}
}
