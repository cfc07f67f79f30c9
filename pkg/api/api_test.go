package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/metrics"
	"github.com/kvgate/kvgate/pkg/state"
)

// recordingSink keeps the rule changes it was told about.
type recordingSink struct {
	mu      sync.Mutex
	changes [][2]*config.Rule
	fail    error
}

func (s *recordingSink) RuleChanged(old, updated *config.Rule) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil && updated != nil {
		return s.fail
	}
	s.changes = append(s.changes, [2]*config.Rule{old, updated})
	return nil
}

func (s *recordingSink) last() [2]*config.Rule {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changes[len(s.changes)-1]
}

// mapInventory is a plain in-memory inventory source.
type mapInventory map[[2]int][]uint64

func (m mapInventory) Snapshot(sid, ep int) (string, []uint64, bool) {
	h, ok := m[[2]int{sid, ep}]
	return "", h, ok
}

type fixture struct {
	srv     *Server
	ts      *httptest.Server
	sink    *recordingSink
	store   *state.Store
	metrics *metrics.Metrics
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newFixture(t *testing.T, dir string, inv InventorySource) *fixture {
	t.Helper()
	st, err := state.Open(dir, quiet())
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(metrics.Options{NoProcessCollectors: true})
	f := &fixture{sink: &recordingSink{}, store: st, metrics: m}
	f.srv = New(Options{Settings: config.DefaultSettings(), Sink: f.sink, Store: st, Inventory: inv, Metrics: m, Gatherer: m.Registry, Log: quiet()})
	rules, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Restore(rules); err != nil {
		t.Fatal(err)
	}
	f.ts = httptest.NewServer(f.srv.Handler())
	t.Cleanup(f.ts.Close)
	return f
}

func (f *fixture) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.ts.URL+path, strings.NewReader(body))
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

func specBody(t *testing.T) string {
	b, err := os.ReadFile("testdata/spec_8_1.json")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const lbPath = "/netlox/v1/config/loadbalancer"

func TestSpecBodyVerbatim(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	code, body := f.do(t, "POST", lbPath, specBody(t))
	if code != 200 || strings.TrimSpace(body) != `{"result":"Success","service_id":1}` {
		t.Fatalf("POST spec §8.1 body: %d %s", code, body)
	}
	code, body = f.do(t, "GET", lbPath+"/all", "")
	if code != 200 {
		t.Fatalf("GET all: %d %s", code, body)
	}
	var list struct {
		LBAttr []struct {
			ServiceArguments map[string]any   `json:"serviceArguments"`
			Endpoints        []map[string]any `json:"endpoints"`
		} `json:"lbAttr"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.LBAttr) != 1 {
		t.Fatalf("lbAttr: %s", body)
	}
	args := list.LBAttr[0].ServiceArguments
	for k, want := range map[string]any{"externalIP": "10.10.10.254", "port": 8080.0, "protocol": "tcp", "sel": 3.0, "mode": 4.0,
		"kvExactMode": 1.0, "kvZmqPort": 5557.0, "kvHashAlgo": "sha256_cbor", "kvBlockSize": 16.0, "kvWarmupSec": 30.0, "service_id": 1.0} {
		if args[k] != want {
			t.Errorf("serviceArguments.%s = %v, want %v", k, args[k], want)
		}
	}
	eps := list.LBAttr[0].Endpoints
	if len(eps) != 2 {
		t.Fatalf("endpoints: %v", eps)
	}
	for i, want := range []map[string]any{
		{"endpointIP": "192.0.2.1", "targetPort": 8000.0, "weight": 1.0, "ep_role": 1.0, "ep_idx": 0.0, "state": "active", "admin": "up"},
		{"endpointIP": "192.0.2.2", "targetPort": 8000.0, "weight": 1.0, "ep_role": 2.0, "ep_idx": 1.0, "state": "active", "admin": "up"},
	} {
		for k, v := range want {
			if eps[i][k] != v {
				t.Errorf("endpoints[%d].%s = %v, want %v", i, k, eps[i][k], v)
			}
		}
	}
	ch := f.sink.last()
	if ch[0] != nil || ch[1] == nil || ch[1].ServiceID != 1 || !ch[1].PDDisagg() {
		t.Errorf("sink got %+v", ch)
	}
	// GET by key, with a differently spelled address and protocol.
	code, body = f.do(t, "GET", lbPath+"/externalipaddress/10.10.10.254/port/8080/protocol/TCP", "")
	if code != 200 || !strings.Contains(body, `"service_id":1`) {
		t.Errorf("GET by key: %d %s", code, body)
	}
	code, body = f.do(t, "GET", lbPath+"/id/1", "")
	if code != 200 || !strings.Contains(body, `"service_id":1`) {
		t.Errorf("GET by id: %d %s", code, body)
	}
}

// mutate returns the spec body with edits applied to the decoded JSON.
func mutate(t *testing.T, base string, edit func(args map[string]any, eps []map[string]any) []map[string]any) string {
	t.Helper()
	var doc struct {
		Args map[string]any   `json:"serviceArguments"`
		Eps  []map[string]any `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(base), &doc); err != nil {
		t.Fatal(err)
	}
	if eps := edit(doc.Args, doc.Eps); eps != nil {
		doc.Eps = eps
	}
	b, _ := json.Marshal(doc)
	return string(b)
}

func TestValidation400(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	set := func(k string, v any) func(map[string]any, []map[string]any) []map[string]any {
		return func(a map[string]any, _ []map[string]any) []map[string]any { a[k] = v; return nil }
	}
	setEP := func(i int, k string, v any) func(map[string]any, []map[string]any) []map[string]any {
		return func(_ map[string]any, e []map[string]any) []map[string]any { e[i][k] = v; return nil }
	}
	cases := []struct {
		name  string
		edit  func(map[string]any, []map[string]any) []map[string]any
		field string
		words string
	}{
		{"externalIP", set("externalIP", "vip"), "externalIP", "not an IP"},
		{"port", set("port", 0), "port", "1-65535"},
		{"protocol", set("protocol", "sctp"), "protocol", "allowed values: tcp"},
		{"mode", set("mode", 7), "mode", "0-5"},
		{"sel", set("sel", 42), "sel", "rr"},
		{"kvExactMode 2", set("kvExactMode", 2), "kvExactMode", "reserved"},
		{"kvExactMode 5", set("kvExactMode", 5), "kvExactMode", "allowed values"},
		{"kv needs fullproxy", set("mode", 0), "kvExactMode", "mode 4"},
		{"kvBlockSize", set("kvBlockSize", -16), "kvBlockSize", "allowed 1-"},
		{"kvZmqPort", set("kvZmqPort", 65536), "kvZmqPort", "1-65535"},
		{"kvDpRankCount", set("kvDpRankCount", 9), "kvDpRankCount", "1-8"},
		{"kvWarmupSec", set("kvWarmupSec", -1), "kvWarmupSec", "allowed 0-"},
		{"kvHashAlgo enum", set("kvHashAlgo", "md5"), "kvHashAlgo", `kv-hash-algo must be one of "sha256_cbor", "xxhash_cbor", "sha256_sglang", "blockhash_trtllm"`},
		{"kvHashAlgo sglang on vllm", set("kvHashAlgo", "sha256_sglang"), "kvHashAlgo", `incompatible with kv-engine-type "vllm"`},
		{"kvHashAlgo trtllm on vllm", set("kvHashAlgo", "blockhash_trtllm"), "kvHashAlgo", `incompatible with kv-engine-type "vllm"`},
		{"xxhash needs seed", set("kvHashAlgo", "xxhash_cbor"), "kvHashAlgo", "seed"},
		{"engine sglang, vllm algo", func(a map[string]any, e []map[string]any) []map[string]any {
			a["kvEngineType"], a["kvHashAlgo"] = "sglang", "sha256_cbor"
			return nil
		}, "kvHashAlgo", `incompatible with kv-engine-type "sglang"`},
		{"engine trtllm with ranks", func(a map[string]any, _ []map[string]any) []map[string]any {
			a["kvEngineType"], a["kvDpRankCount"] = "trtllm", 2
			delete(a, "kvHashAlgo")
			return nil
		}, "kvDpRankCount", "meaningless for kv-engine-type trtllm"},
		{"engine unknown", set("kvEngineType", "tgi"), "kvEngineType", `kv-engine-type must be one of "vllm", "sglang", "trtllm"`},
		{"llamacpp rejects kv", set("kvEngineType", "llamacpp"), "kvExactMode", "llamacpp"},
		{"mode 1 needs decode", setEP(1, "ep_role", 1), "ep_role", "decode"},
		{"mode 1 needs prefill", setEP(0, "ep_role", 0), "ep_role", "prefill"},
		{"mode 3 no roles", set("kvExactMode", 3), "ep_role", "must not carry roles"},
		{"cache aware needs pd", func(a map[string]any, e []map[string]any) []map[string]any {
			a["kvExactMode"] = 0
			a["pd_cache_aware_mode"] = true
			return nil
		}, "pd_cache_aware_mode", "pd_disagg_mode"},
		{"pd_cache_threshold", set("pd_cache_threshold", 101), "pd_cache_threshold", "0-100"},
		{"pd_session_ttl_sec", set("pd_session_ttl_sec", -1), "pd_session_ttl_sec", "0-"},
		{"pd_balance_abs_threshold", set("pd_balance_abs_threshold", 1000), "pd_balance_abs_threshold", "0-255"},
		{"pdBootstrapPort", set("pdBootstrapPort", 8998), "pdBootstrapPort", "sglang"},
		{"probetype", set("probetype", "icmp"), "probetype", "http, tcp, none"},
		{"probereq", set("probereq", "health check"), "probereq", "/health"},
		{"probeport", set("probeport", 70000), "probeport", "0-65535"},
		{"probeTimeout", set("probeTimeout", -1), "probeTimeout", "seconds"},
		{"probeRetries", set("probeRetries", -1), "probeRetries", "0-"},
		{"endpointIP", setEP(0, "endpointIP", "host"), "endpoints[0].endpointIP", "not an IP"},
		{"targetPort", setEP(1, "targetPort", 0), "endpoints[1].targetPort", "1-65535"},
		{"weight", setEP(0, "weight", 256), "endpoints[0].weight", "0-255"},
		{"ep_role 3", setEP(0, "ep_role", 3), "endpoints[0].ep_role", "0 none, 1 prefill, 2 decode"},
		{"nixl_port", setEP(0, "nixl_port", 65536), "endpoints[0].nixl_port", "0-65535"},
		{"admin", setEP(0, "admin", "drain"), "admin", "up, down"},
		{"duplicate endpoint", setEP(1, "endpointIP", "192.0.2.1"), "endpoints[1].endpointIP", "twice"},
		{"port as string", set("port", "8080"), "serviceArguments.port", "want an integer"},
		{"kvLoraAdapters not a list", set("kvLoraAdapters", "sql-lora"), "serviceArguments.kvLoraAdapters", "want"},
		{"kvLoraAdapters empty name", set("kvLoraAdapters", []any{"sql-lora", ""}), "serviceArguments.kvLoraAdapters", "empty"},
		{"kvLoraAdapters too long", set("kvLoraAdapters", []any{strings.Repeat("l", 257)}), "serviceArguments.kvLoraAdapters", "256 bytes"},
		{"kvLoraAdapters non-KV rule", func(a map[string]any, _ []map[string]any) []map[string]any {
			a["kvExactMode"], a["pd_disagg_mode"], a["kvLoraAdapters"] = 0, true, []any{"sql-lora"}
			return nil
		}, "serviceArguments.kvLoraAdapters", "KV rules only"},
		{"too many endpoints", func(a map[string]any, _ []map[string]any) []map[string]any {
			a["kvExactMode"] = 3
			var eps []map[string]any
			for i := 0; i < 257; i++ {
				eps = append(eps, map[string]any{"endpointIP": fmt.Sprintf("10.0.%d.%d", i/200, i%200+1), "targetPort": 8000, "weight": 1})
			}
			return eps
		}, "endpoints", "at most 256"},
	}
	base := specBody(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := f.do(t, "POST", lbPath, mutate(t, base, c.edit))
			if code != 400 {
				t.Fatalf("status %d %s", code, body)
			}
			var e errorBody
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != 400 {
				t.Fatalf("body %s", body)
			}
			if !strings.Contains(e.Message, c.field) || !strings.Contains(e.Message, c.words) {
				t.Errorf("message %q does not name %q with %q", e.Message, c.field, c.words)
			}
		})
	}
	for _, raw := range []string{"", "{", "[1,2]", `{"serviceArguments":[]}`} {
		if code, body := f.do(t, "POST", lbPath, raw); code != 400 || !strings.Contains(body, `"code":400`) {
			t.Errorf("malformed %q: %d %s", raw, code, body)
		}
	}
	if code, body := f.do(t, "GET", lbPath+"/all", ""); code != 200 || !strings.Contains(body, `"lbAttr":[]`) {
		t.Errorf("rejected rules were stored: %s", body)
	}
	big := `{"serviceArguments":{"name":"` + strings.Repeat("x", maxBody) + `"}}`
	if code, _ := f.do(t, "POST", lbPath, big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d", code)
	}
}

func TestUnknownFieldsIgnored(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	body := mutate(t, specBody(t), func(a map[string]any, e []map[string]any) []map[string]any {
		a["inactiveTimeOut"] = 30
		a["bgp"] = false
		e[0]["counter"] = "1:2"
		e[0]["state"] = "active"
		e[0]["ep_idx"] = 9
		return nil
	})
	body = strings.Replace(body, "{", `{"secondaryIPs":[{"secondaryIP":"1.2.3.4"}],`, 1)
	if code, resp := f.do(t, "POST", lbPath, body); code != 200 {
		t.Fatalf("%d %s", code, resp)
	}
	if _, resp := f.do(t, "GET", lbPath+"/all", ""); strings.Contains(resp, `"ep_idx":9`) {
		t.Errorf("a posted ep_idx must be ignored: %s", resp)
	}
}

func epBody(ip string, port, role int, extra string) string {
	return fmt.Sprintf(`{"endpointIP":%q,"targetPort":%d,"weight":1,"ep_role":%d%s}`, ip, port, role, extra)
}

func mode3Rule(eps ...string) string {
	return `{"serviceArguments":{"externalIP":"10.0.0.1","port":9000,"protocol":"tcp","sel":0,"mode":4,"kvExactMode":3},"endpoints":[` + strings.Join(eps, ",") + `]}`
}

func indices(t *testing.T, f *fixture) map[string]int {
	t.Helper()
	_, body := f.do(t, "GET", lbPath+"/externalipaddress/10.0.0.1/port/9000/protocol/tcp", "")
	var v listView
	if err := json.Unmarshal([]byte(body), &v); err != nil || len(v.LBAttr) != 1 {
		t.Fatalf("GET: %v %s", err, body)
	}
	out := map[string]int{}
	for _, e := range v.LBAttr[0].Endpoints {
		out[fmt.Sprintf("%s:%d", e.EndpointIP, e.TargetPort)] = e.EPIdx
	}
	return out
}

func TestUpdateKeepsEpIdx(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	post := func(body string) {
		t.Helper()
		if code, resp := f.do(t, "POST", lbPath, body); code != 200 || !strings.Contains(resp, `"service_id":1`) {
			t.Fatalf("%d %s", code, resp)
		}
	}
	post(mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, ""), epBody("10.0.1.3", 8000, 0, "")))
	want := map[string]int{"10.0.1.1:8000": 0, "10.0.1.2:8000": 1, "10.0.1.3:8000": 2}
	if got := indices(t, f); !mapsEqual(got, want) {
		t.Fatalf("create: %v", got)
	}
	// .2 leaves, .4 and a second port on .1 join, order shuffled.
	post(mode3Rule(epBody("10.0.1.4", 8000, 0, ""), epBody("10.0.1.3", 8000, 0, ""), epBody("10.0.1.1", 8001, 0, ""), epBody("10.0.1.1", 8000, 0, "")))
	want = map[string]int{"10.0.1.1:8000": 0, "10.0.1.3:8000": 2, "10.0.1.4:8000": 3, "10.0.1.1:8001": 4}
	if got := indices(t, f); !mapsEqual(got, want) {
		t.Fatalf("update: %v, want %v", got, want)
	}
	ch := f.sink.last()
	if ch[0] == nil || ch[1] == nil || len(ch[0].Endpoints) != 3 || len(ch[1].Endpoints) != 4 {
		t.Fatalf("sink update: %+v", ch)
	}
	// .2 comes back: a fresh index.
	post(mode3Rule(epBody("10.0.1.2", 8000, 0, ""), epBody("10.0.1.1", 8000, 0, "")))
	want = map[string]int{"10.0.1.1:8000": 0, "10.0.1.2:8000": 5}
	if got := indices(t, f); !mapsEqual(got, want) {
		t.Fatalf("rejoin: %v", got)
	}
	// The engine type is immutable.
	code, body := f.do(t, "POST", lbPath, strings.Replace(mode3Rule(epBody("10.0.1.1", 8000, 0, "")), `"kvExactMode":3`, `"kvExactMode":0,"kvEngineType":"llamacpp"`, 1))
	if code != 409 || !strings.Contains(body, `"code":409`) || !strings.Contains(body, "kvEngineType") {
		t.Fatalf("engine change: %d %s", code, body)
	}
	// A second rule gets service_id 2; deleting rule 1 frees 1 for the next.
	second := strings.Replace(mode3Rule(epBody("10.0.1.1", 8000, 0, "")), `"port":9000`, `"port":9001`, 1)
	if code, body := f.do(t, "POST", lbPath, second); code != 200 || !strings.Contains(body, `"service_id":2`) {
		t.Fatalf("second rule: %d %s", code, body)
	}
	if code, body := f.do(t, "DELETE", lbPath+"/externalipaddress/10.0.0.1/port/9000/protocol/tcp", ""); code != 200 || strings.TrimSpace(body) != `{"result":"Success"}` {
		t.Fatalf("delete: %d %s", code, body)
	}
	if ch := f.sink.last(); ch[0] == nil || ch[1] != nil || ch[0].ServiceID != 1 {
		t.Fatalf("sink delete: %+v", ch)
	}
	if code, _ := f.do(t, "DELETE", lbPath+"/externalipaddress/10.0.0.1/port/9000/protocol/tcp", ""); code != 404 {
		t.Fatalf("second delete: %d", code)
	}
	if code, _ := f.do(t, "GET", lbPath+"/externalipaddress/10.0.0.1/port/9000/protocol/tcp", ""); code != 404 {
		t.Fatalf("get deleted: %d", code)
	}
	if code, body := f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""))); code != 200 || !strings.Contains(body, `"service_id":1`) {
		t.Fatalf("recreate: %d %s", code, body)
	}
	if code, body := f.do(t, "DELETE", lbPath+"/all", ""); code != 200 || !strings.Contains(body, "Success") {
		t.Fatalf("delete all: %d %s", code, body)
	}
	if _, body := f.do(t, "GET", lbPath+"/all", ""); strings.TrimSpace(body) != `{"lbAttr":[]}` {
		t.Fatalf("after delete all: %s", body)
	}
	for _, bad := range []string{"/externalipaddress/x/port/1/protocol/tcp", "/externalipaddress/10.0.0.1/port/0/protocol/tcp"} {
		if code, _ := f.do(t, "DELETE", lbPath+bad, ""); code != 400 {
			t.Errorf("DELETE %s: %d", bad, code)
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestAdminState(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	if code, body := f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, ""))); code != 200 {
		t.Fatal(code, body)
	}
	path := lbPath + "/externalipaddress/10.0.0.1/port/9000/protocol/tcp/endpoint"
	if code, body := f.do(t, "PUT", path, `{"endpointIP":"10.0.1.2","targetPort":8000,"admin":"down"}`); code != 200 {
		t.Fatal(code, body)
	}
	ch := f.sink.last()
	if e, _ := ch[1].EndpointByKey("10.0.1.2:8000"); !e.AdminDown {
		t.Fatalf("sink not told: %+v", ch[1])
	}
	if _, body := f.do(t, "GET", lbPath+"/all", ""); !strings.Contains(body, `"ep_idx":1,"state":"active","admin":"down"`) {
		t.Fatalf("GET: %s", body)
	}
	// Re-posting the rule without admin fields keeps the endpoint down.
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, "")))
	if _, body := f.do(t, "GET", lbPath+"/all", ""); !strings.Contains(body, `"admin":"down"`) {
		t.Fatalf("re-post without admin lost the admin state: %s", body)
	}
	// An explicit admin in the post wins.
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, `,"admin":"up"`)))
	if _, body := f.do(t, "GET", lbPath+"/all", ""); strings.Contains(body, `"admin":"down"`) {
		t.Fatalf("explicit admin up ignored: %s", body)
	}
	for _, c := range []struct {
		body string
		code int
	}{
		{`{"endpointIP":"10.0.1.9","targetPort":8000,"admin":"down"}`, 404},
		{`{"endpointIP":"10.0.1.1","targetPort":8000,"admin":"off"}`, 400},
		{`{"endpointIP":"10.0.1.1","targetPort":8000}`, 400},
		{`{"endpointIP":"x","targetPort":8000,"admin":"up"}`, 400},
	} {
		if code, body := f.do(t, "PUT", path, c.body); code != c.code {
			t.Errorf("%s: %d %s", c.body, code, body)
		}
	}
	if code, _ := f.do(t, "PUT", lbPath+"/externalipaddress/10.0.0.9/port/9000/protocol/tcp/endpoint", `{"endpointIP":"10.0.1.1","targetPort":8000,"admin":"up"}`); code != 404 {
		t.Errorf("unknown rule: %d", code)
	}
}

func TestSinkErrorRejectsChange(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	f.sink.fail = errors.New("listen tcp 10.10.10.254:8080: bind: address already in use")
	code, body := f.do(t, "POST", lbPath, specBody(t))
	if code != 500 || !strings.Contains(body, "address already in use") || !strings.Contains(body, `"code":500`) {
		t.Fatalf("%d %s", code, body)
	}
	if len(f.srv.Rules()) != 0 {
		t.Fatal("a rule the daemon refused was stored")
	}
	rules, _ := f.store.Load()
	if len(rules) != 0 {
		t.Fatal("a rule the daemon refused was persisted")
	}
}

// failingStore fails every Save while fail is set.
type failingStore struct{ fail bool }

func (s *failingStore) Save([]config.Rule) error {
	if s.fail {
		return errors.New("disk full")
	}
	return nil
}

// TestFailedSaveRollsBack: a change the store could not save is undone in
// memory and in the daemon (the sink is told the reverse change), for a new
// rule and for an update.
func TestFailedSaveRollsBack(t *testing.T) {
	st := &failingStore{fail: true}
	sink := &recordingSink{}
	srv := New(Options{Settings: config.DefaultSettings(), Sink: sink, Store: st, Log: quiet()})
	var posted config.Rule
	if err := json.Unmarshal([]byte(specBody(t)), &posted); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Apply(&posted, nil); err == nil || !strings.Contains(err.Error(), "not saved") {
		t.Fatalf("create with a failing store: %v", err)
	}
	if len(srv.Rules()) != 0 {
		t.Fatal("an unsaved new rule stayed installed")
	}
	if c := sink.last(); c[0] == nil || c[1] != nil {
		t.Fatalf("sink not told to remove the unsaved rule: %v", c)
	}

	st.fail = false
	if _, err := srv.Apply(&posted, nil); err != nil {
		t.Fatal(err)
	}
	updated := posted.Clone()
	updated.Endpoints[0].AdminDown = true
	st.fail = true
	if _, err := srv.Apply(updated, nil); err == nil || !strings.Contains(err.Error(), "not saved") {
		t.Fatalf("update with a failing store: %v", err)
	}
	if after := srv.Rules(); len(after) != 1 || after[0].Endpoints[0].AdminDown {
		t.Fatalf("an unsaved update stayed installed: %+v", after)
	}
	if c := sink.last(); c[0] == nil || !c[0].Endpoints[0].AdminDown || c[1] == nil || c[1].Endpoints[0].AdminDown {
		t.Fatalf("sink not told to restore the saved rule: %v", c)
	}
}

func TestPersistenceAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir, nil)
	f.do(t, "POST", lbPath, specBody(t))
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, ""), epBody("10.0.1.3", 8000, 0, "")))
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.3", 8000, 0, ""), epBody("10.0.1.4", 8000, 0, "")))
	f.do(t, "PUT", lbPath+"/externalipaddress/10.0.0.1/port/9000/protocol/tcp/endpoint", `{"endpointIP":"10.0.1.4","targetPort":8000,"admin":"down"}`)
	_, before := f.do(t, "GET", lbPath+"/all", "")
	f.ts.Close()

	g := newFixture(t, dir, nil)
	_, after := g.do(t, "GET", lbPath+"/all", "")
	if before != after {
		t.Fatalf("state changed across restart:\nbefore %s\nafter  %s", before, after)
	}
	if len(g.sink.changes) != 2 {
		t.Fatalf("restore must start each rule: %d sink calls", len(g.sink.changes))
	}
	// ep_idx allocation continues where it stopped: .2 rejoining gets 4, not 1.
	g.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.3", 8000, 0, ""), epBody("10.0.1.4", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, "")))
	if got := indices(t, g); got["10.0.1.2:8000"] != 4 {
		t.Fatalf("after restart: %v", got)
	}
	_, before = g.do(t, "GET", lbPath+"/all", "")
	g.ts.Close()

	// Truncate the state file mid-write: the previous generation comes back.
	cur := filepath.Join(dir, "rules.json")
	b, err := os.ReadFile(cur)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cur, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	h := newFixture(t, dir, nil)
	_, restored := h.do(t, "GET", lbPath+"/all", "")
	if restored != after {
		t.Fatalf("truncated file: want the previous generation\n got %s\nwant %s", restored, after)
	}
	_ = before
}

func TestInventoryShape(t *testing.T) {
	inv := mapInventory{{1, 0}: {18446744073709551615, 3, 9007199254740993, 42}}
	f := newFixture(t, t.TempDir(), inv)
	f.do(t, "POST", lbPath, specBody(t))
	code, body := f.do(t, "GET", "/netlox/v1/config/ai/kv/inventory?service_id=1&ep_idx=0", "")
	want := `{"service_id":1,"ep_idx":0,"hash_algo":"sha256_cbor","blocks":[{"block_idx":0,"hash_uint64":3},{"block_idx":1,"hash_uint64":42},{"block_idx":2,"hash_uint64":9007199254740993},{"block_idx":3,"hash_uint64":18446744073709551615}],"total":4}`
	if code != 200 || strings.TrimSpace(body) != want {
		t.Fatalf("%d\n got %s\nwant %s", code, body, want)
	}
	// Decodes as the reference's shape, uint64 intact.
	var doc struct {
		Blocks []struct {
			BlockIdx int    `json:"block_idx"`
			Hash     uint64 `json:"hash_uint64"`
		} `json:"blocks"`
		Total int `json:"total"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(body)))
	if err := dec.Decode(&doc); err != nil || doc.Blocks[3].Hash != 18446744073709551615 || doc.Total != 4 {
		t.Fatalf("%v %+v", err, doc)
	}
	if !slices.IsSortedFunc(doc.Blocks, func(a, b struct {
		BlockIdx int    `json:"block_idx"`
		Hash     uint64 `json:"hash_uint64"`
	}) int {
		if a.Hash < b.Hash {
			return -1
		}
		return 1
	}) {
		t.Error("blocks not sorted by hash")
	}
	for _, c := range []struct {
		q    string
		code int
		body string
	}{
		{"service_id=x&ep_idx=0", 400, `{"error":"invalid service_id: strconv.ParseUint: parsing \"x\": invalid syntax"}`},
		{"ep_idx=0", 400, `{"error":"invalid service_id: strconv.ParseUint: parsing \"\": invalid syntax"}`},
		{"service_id=1&ep_idx=z", 400, `{"error":"invalid ep_idx: strconv.Atoi: parsing \"z\": invalid syntax"}`},
		{"service_id=9&ep_idx=0", 404, `{"error":"service or endpoint not found"}`},
		{"service_id=1&ep_idx=1", 404, `{"error":"service or endpoint not found"}`}, // the decode endpoint is not subscribed
		{"service_id=1&ep_idx=7", 404, `{"error":"service or endpoint not found"}`},
	} {
		code, body := f.do(t, "GET", "/netlox/v1/config/ai/kv/inventory?"+c.q, "")
		if code != c.code || strings.TrimSpace(body) != c.body {
			t.Errorf("%s: %d %s", c.q, code, body)
		}
	}
	if code, body := f.do(t, "POST", "/netlox/v1/config/ai/kv/inventory?service_id=1&ep_idx=0", ""); code != 405 || strings.TrimSpace(body) != "Method not allowed" {
		t.Errorf("POST inventory: %d %q", code, body)
	}
	// Empty inventory: blocks is an empty array.
	inv[[2]int{1, 0}] = nil
	if _, body := f.do(t, "GET", "/netlox/v1/config/ai/kv/inventory?service_id=1&ep_idx=0", ""); strings.TrimSpace(body) != `{"service_id":1,"ep_idx":0,"hash_algo":"sha256_cbor","blocks":[],"total":0}` {
		t.Errorf("empty: %s", body)
	}
	g := newFixture(t, t.TempDir(), nil)
	if code, body := g.do(t, "GET", "/netlox/v1/config/ai/kv/inventory?service_id=1&ep_idx=0", ""); code != 503 || strings.TrimSpace(body) != `{"error":"kv inventory provider not registered"}` {
		t.Errorf("no provider: %d %s", code, body)
	}
}

func TestMetricsEndpointsAndSeriesLifecycle(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	if code, body := f.do(t, "GET", "/metrics", ""); code != 200 || strings.Contains(body, "loxilb_pd_kv_tier15_miss_reason_total{") {
		t.Fatalf("series before any rule: %d %.300s", code, body)
	}
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, "")))
	for _, p := range []string{"/netlox/v1/metrics", "/metrics"} {
		code, body := f.do(t, "GET", p, "")
		for _, r := range metrics.MissReasons {
			if code != 200 || !strings.Contains(body, `loxilb_pd_kv_tier15_miss_reason_total{reason="`+r+`",service="1"} 0`) {
				t.Errorf("%s: %d lacks miss reason %s at 0", p, code, r)
			}
		}
		if !strings.Contains(body, `loxilb_pd_kv_tier15_fallthrough_total{service="1"} 0`) || !strings.Contains(body, "kvgate_rules 1") {
			t.Errorf("%s: fallthrough or kvgate_rules missing", p)
		}
	}
	f.metrics.SetKVBlocks(1, 1, 5)
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, "")))
	if _, body := f.do(t, "GET", "/metrics", ""); strings.Contains(body, `loxilb_pd_kv_blocks{ep_idx="1"`) {
		t.Error("a removed endpoint's series survived the update")
	}
	f.do(t, "PUT", lbPath+"/externalipaddress/10.0.0.1/port/9000/protocol/tcp/endpoint", `{"endpointIP":"10.0.1.1","targetPort":8000,"admin":"down"}`)
	if _, body := f.do(t, "GET", "/metrics", ""); !strings.Contains(body, `kvgate_endpoint_admin_down{ep_idx="0",service="1"} 1`) {
		t.Error("admin gauge not set")
	}
	f.do(t, "DELETE", lbPath+"/all", "")
	if _, body := f.do(t, "GET", "/metrics", ""); strings.Contains(body, `service="1"`) || !strings.Contains(body, "kvgate_rules 0") {
		t.Errorf("rule series survived delete:\n%s", body)
	}
}

func TestServeOnLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{Settings: config.DefaultSettings(), Log: quiet()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + lbPath + "/all")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(b)) != `{"lbAttr":[]}` {
		t.Fatalf("%s", b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestPatch(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	f.do(t, "POST", lbPath, mode3Rule(epBody("10.0.1.1", 8000, 0, ""), epBody("10.0.1.2", 8000, 0, `,"admin":"down"`)))
	path := lbPath + "/externalipaddress/10.0.0.1/port/9000/protocol/tcp"
	if code, body := f.do(t, "PATCH", path, `{"serviceArguments":{"kvBlockSize":32,"sel":4}}`); code != 200 || !strings.Contains(body, `"service_id":1`) {
		t.Fatalf("%d %s", code, body)
	}
	_, body := f.do(t, "GET", path, "")
	if !strings.Contains(body, `"kvBlockSize":32`) || !strings.Contains(body, `"sel":4`) || !strings.Contains(body, `"kvExactMode":3`) || !strings.Contains(body, `"admin":"down"`) {
		t.Fatalf("patched rule: %s", body)
	}
	// null removes; endpoints are replaced whole, indices stay by identity.
	f.do(t, "PATCH", path, `{"serviceArguments":{"kvBlockSize":null},"endpoints":[{"endpointIP":"10.0.1.2","targetPort":8000,"weight":1}]}`)
	_, body = f.do(t, "GET", path, "")
	if strings.Contains(body, "kvBlockSize") || strings.Contains(body, "10.0.1.1") || !strings.Contains(body, `"ep_idx":1`) {
		t.Fatalf("after null and endpoint replace: %s", body)
	}
	for _, c := range []struct {
		patch string
		code  int
	}{
		{`{"serviceArguments":{"port":9001}}`, 400},
		{`{"serviceArguments":{"kvExactMode":2}}`, 400},
		{`{"serviceArguments":{"kvEngineType":"llamacpp","kvExactMode":0}}`, 409},
		{`{`, 400},
	} {
		if code, body := f.do(t, "PATCH", path, c.patch); code != c.code {
			t.Errorf("%s: %d %s", c.patch, code, body)
		}
	}
	if code, _ := f.do(t, "PATCH", lbPath+"/externalipaddress/10.0.0.2/port/9000/protocol/tcp", `{}`); code != 404 {
		t.Errorf("patch unknown rule: %d", code)
	}
}

// TestLoraAdaptersRoundTrip: kvLoraAdapters is echoed by GET as posted and
// survives a restart.
func TestLoraAdaptersRoundTrip(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir, nil)
	body := `{"serviceArguments":{"externalIP":"10.0.0.1","port":9000,"protocol":"tcp","sel":0,"mode":4,"kvExactMode":3,` +
		`"kvLoraAdapters":["sql-lora","chat-lora=Qwen/Qwen3-0.6B"]},"endpoints":[` + epBody("10.0.1.1", 8000, 0, "") + `]}`
	if code, resp := f.do(t, "POST", lbPath, body); code != 200 {
		t.Fatalf("POST: %d %s", code, resp)
	}
	want := `"kvLoraAdapters":["sql-lora","chat-lora=Qwen/Qwen3-0.6B"]`
	if _, got := f.do(t, "GET", lbPath+"/all", ""); !strings.Contains(got, want) {
		t.Fatalf("GET lacks %s: %s", want, got)
	}
	if r := f.sink.last()[1]; r == nil || len(r.LoraAdapters()) != 2 || r.LoraAdapters()[1].TokenizerModel != "Qwen/Qwen3-0.6B" {
		t.Fatalf("the sink got %+v", r)
	}
	f.ts.Close()
	g := newFixture(t, dir, nil)
	if _, got := g.do(t, "GET", lbPath+"/all", ""); !strings.Contains(got, want) {
		t.Fatalf("after restart GET lacks %s: %s", want, got)
	}
}
