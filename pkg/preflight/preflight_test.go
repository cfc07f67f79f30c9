package preflight

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

const warmMetrics = `# HELP vllm:num_requests_waiting x
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:num_requests_running{engine="0",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="27000",prefix_caching_hash_algo="sha256_cbor"} 1
vllm:prompt_tokens_total{engine="0",model_name="m"} 10
vllm:generation_tokens_total{engine="0",model_name="m"} 10
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 1
`

// engine serves /health, /v1/models and the given /metrics text.
func engine(t *testing.T, metrics, models string) config.Endpoint {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(models)) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(metrics)) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	p, _ := strconv.Atoi(port)
	return config.Endpoint{Idx: 0, IP: host, TargetPort: p}
}

func kvRule(algo string, bs int) *config.Rule {
	r := &config.Rule{ServiceID: 1}
	r.Args.KVExactMode = 3
	r.Args.KVHashAlgo = algo
	r.Args.KVBlockSize = bs
	return r
}

func TestCheckMetrics(t *testing.T) {
	const models = `{"data":[{"id":"m","parent":null}]}`
	cases := []struct {
		name    string
		metrics string
		rule    *config.Rule
		result  string
		text    string
	}{
		{"warm-match", warmMetrics, kvRule("sha256_cbor", 16), Pass, "num_gpu_blocks=27000"},
		{"cold-engine", strings.Join(strings.Split(warmMetrics, "\n")[:5], "\n") + "\n", kvRule("sha256_cbor", 16), Warn, "warm up first"},
		{"algo", warmMetrics, kvRule("xxhash_cbor", 16), Fail, "set kvHashAlgo=sha256_cbor"},
		{"block-size", warmMetrics, kvRule("sha256_cbor", 32), Fail, "set kvBlockSize=16"},
		{"prefix-match-unit", strings.Replace(warmMetrics, `block_size="16"`, `block_size="64",prefix_match_unit="16"`, 1), kvRule("sha256_cbor", 16), Pass, "prefix_match_unit=16"},
		{"v0-engine", strings.Replace(warmMetrics, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", 1), kvRule("sha256_cbor", 16), Fail, "vllm:kv_cache_usage_perc"},
		{"no-prefix-caching", strings.Replace(warmMetrics, `enable_prefix_caching="True"`, `enable_prefix_caching="False"`, 1), kvRule("sha256_cbor", 16), Fail, "--enable-prefix-caching"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ep := engine(t, tc.metrics, models)
			r := New(nil)
			f := &endpointFacts{ep: ep}
			if h := r.checkHealth(context.Background(), f); h.Result != Pass {
				t.Fatalf("health: %+v", h)
			}
			c := r.checkMetrics(context.Background(), tc.rule, f)
			if c.Result != tc.result || !strings.Contains(c.Detail+" "+c.Fix, tc.text) {
				t.Fatalf("got %+v, want %s naming %q", c, tc.result, tc.text)
			}
		})
	}
}

func TestCheckHealthModelsAndLoRA(t *testing.T) {
	cases := []struct {
		name, models string
		result       string
		detail       string
	}{
		{"base-and-lora", `{"data":[{"id":"Qwen/Qwen3-0.6B","parent":null},{"id":"sql-lora","parent":"Qwen/Qwen3-0.6B"}]}`, Pass,
			"serves Qwen/Qwen3-0.6B; LoRA adapters sql-lora"},
		{"no-models", `{"data":[]}`, Fail, "no model listed"},
		{"not-json", `<html>`, Fail, "no model listed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &endpointFacts{ep: engine(t, warmMetrics, tc.models)}
			c := New(nil).checkHealth(context.Background(), f)
			if c.Result != tc.result || !strings.Contains(c.Detail, tc.detail) {
				t.Fatalf("got %+v", c)
			}
		})
	}
	// A closed port fails with a fix.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := New(nil).checkHealth(context.Background(), &endpointFacts{ep: config.Endpoint{IP: "127.0.0.1", TargetPort: port}})
	if c.Result != Fail || c.Fix == "" {
		t.Fatalf("closed port: %+v", c)
	}
}

func TestParseLabels(t *testing.T) {
	got := parseFamilies([]byte(`x{a="1",b="with \"quote\", comma",c=""} 1` + "\n" + `y 2` + "\n"))
	if got["x"]["a"] != "1" || got["x"]["b"] != `with "quote", comma` || got["x"]["c"] != "" {
		t.Fatalf("labels %v", got["x"])
	}
	if _, ok := got["y"]; !ok {
		t.Fatal("family without labels missing")
	}
}

// TestCheckServerInfo: for SGLang and TensorRT-LLM rules, check 2 reads the
// engine's block size from its own info document (SGLang's /get_server_info
// page_size, TensorRT-LLM's /server_info tokens_per_block and
// kv_cache_hash_algo) and names the setting to change.
func TestCheckServerInfo(t *testing.T) {
	rule := func(engine string, bs int) *config.Rule {
		r := kvRule("", bs)
		r.Args.KVEngineType = engine
		return r
	}
	cases := []struct {
		name, path, doc string
		rule            *config.Rule
		result, text    string
	}{
		{"sglang-match", "/get_server_info", `{"page_size":16,"model_path":"m"}`, rule("sglang", 16), Pass, "page_size=16"},
		{"sglang-page-size", "/get_server_info", `{"page_size":64}`, rule("sglang", 16), Fail, "set kvBlockSize=64"},
		{"sglang-no-info", "/other", `{}`, rule("sglang", 16), Warn, "could not be compared"},
		{"trtllm-match", "/server_info", `{"tokens_per_block":32,"kv_cache_hash_algo":"v1_block_key"}`, rule("trtllm", 32), Pass, "tokens_per_block=32"},
		{"trtllm-auto", "/server_info", `{"tokens_per_block":32,"kv_cache_hash_algo":"auto"}`, rule("trtllm", 32), Pass, "kv_cache_hash_algo=auto"},
		{"trtllm-block", "/server_info", `{"tokens_per_block":64,"kv_cache_hash_algo":"v1_block_key"}`, rule("trtllm", 32), Fail, "set kvBlockSize=64"},
		{"trtllm-algo", "/server_info", `{"tokens_per_block":32,"kv_cache_hash_algo":"sha256"}`, rule("trtllm", 32), Fail, "v1 block key only"},
		{"trtllm-no-size", "/server_info", `{"kv_cache_hash_algo":"v1_block_key"}`, rule("trtllm", 32), Warn, "names no tokens_per_block"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET "+tc.path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(tc.doc)) })
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
			p, _ := strconv.Atoi(port)
			c := New(nil).checkMetrics(context.Background(), tc.rule, &endpointFacts{ep: config.Endpoint{IP: host, TargetPort: p}})
			if c.Result != tc.result || !strings.Contains(c.Detail+" "+c.Fix, tc.text) {
				t.Fatalf("got %+v, want %s naming %q", c, tc.result, tc.text)
			}
		})
	}
}
