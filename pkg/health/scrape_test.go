package health

import (
	"strings"
	"testing"
)

const vllmMetrics = `# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 2.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="27354",num_cpu_blocks="None",prefix_caching_hash_algo="sha256_cbor"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1234.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0"} 1.5
vllm:e2e_request_latency_seconds_count{engine="0"} 2.0
`

func TestParseEngineMetrics(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    EngineMetrics
		wantErr bool
	}{
		{name: "vllm", body: vllmMetrics, want: EngineMetrics{GPUBlocks: 27354, Waiting: 5, Running: -1}},
		{name: "no families", body: "# TYPE other gauge\nother 1\n", want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
		{name: "empty", body: "", want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
		{name: "waiting only", body: "vllm:num_requests_waiting 7\n", want: EngineMetrics{GPUBlocks: -1, Waiting: 7, Running: -1}},
		{name: "blocks label missing", body: "vllm:cache_config_info{block_size=\"16\"} 1\n", want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
		{name: "blocks None", body: "vllm:cache_config_info{num_gpu_blocks=\"None\"} 1\n", want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
		{name: "garbage", body: "this is not { metrics\n", wantErr: true, want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
		{name: "running and waiting", body: "vllm:num_requests_running{engine=\"0\"} 4\nvllm:num_requests_running{engine=\"1\"} 2\nvllm:num_requests_waiting 1\n", want: EngineMetrics{GPUBlocks: -1, Waiting: 1, Running: 6}},
		{name: "running NaN", body: "vllm:num_requests_running NaN\n", want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
		{name: "too big", body: strings.Repeat("# c\n", MaxScrapeBytes/4+1), wantErr: true, want: EngineMetrics{GPUBlocks: -1, Waiting: -1, Running: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEngineMetrics(strings.NewReader(tc.body))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v (err %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func FuzzParseEngineMetrics(f *testing.F) {
	f.Add(vllmMetrics)
	f.Add("vllm:num_requests_waiting NaN\n")
	f.Add("vllm:num_requests_waiting -3\nvllm:cache_config_info{num_gpu_blocks=\"99999999999999\"} 1\n")
	f.Fuzz(func(t *testing.T, body string) {
		m, _ := ParseEngineMetrics(strings.NewReader(body))
		if m.Waiting < -1 || m.GPUBlocks < -1 {
			t.Fatalf("negative figures %+v", m)
		}
	})
}
