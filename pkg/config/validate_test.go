package config

import (
	"errors"
	"strings"
	"testing"
)

func baseKVRule() *Rule {
	return &Rule{
		Args: ServiceArguments{ExternalIP: "10.10.10.254", Port: 8080, Protocol: "tcp", Sel: 3, Mode: 4, KVExactMode: 1},
		Endpoints: []Endpoint{
			{IP: "192.0.2.1", TargetPort: 8000, Weight: 1, Role: RolePrefill},
			{IP: "192.0.2.2", TargetPort: 8000, Weight: 1, Role: RoleDecode},
		},
	}
}

func TestValidateRejects(t *testing.T) {
	strp := func(s string) *string { return &s }
	cases := []struct {
		name  string
		edit  func(r *Rule)
		field string // the field the error must name
		words string // a fragment of the allowed values / explanation
	}{
		{"bad externalIP", func(r *Rule) { r.Args.ExternalIP = "nope" }, "externalIP", "not an IP"},
		{"port 0", func(r *Rule) { r.Args.Port = 0 }, "port", "1-65535"},
		{"udp", func(r *Rule) { r.Args.Protocol = "udp" }, "protocol", "tcp"},
		{"mode 9", func(r *Rule) { r.Args.Mode = 9 }, "mode", "0-5"},
		{"sel 11", func(r *Rule) { r.Args.Sel = 11 }, "sel", "rr"},
		{"sel 7", func(r *Rule) { r.Args.Sel = 7 }, "sel", "reserved"},
		{"sel 8 needs mode 4", func(r *Rule) { *r = Rule{Args: ServiceArguments{ExternalIP: "1.1.1.1", Port: 1, Sel: 8}} }, "sel", "mode 4"},
		{"kvExactMode 4", func(r *Rule) { r.Args.KVExactMode = 4 }, "kvExactMode", "0 off, 1 P/D, 3 single pool"},
		{"kvExactMode -1", func(r *Rule) { r.Args.KVExactMode = -1 }, "kvExactMode", "allowed values"},
		{"kvExactMode 2 reserved", func(r *Rule) { r.Args.KVExactMode = 2 }, "kvExactMode", "reserved"},
		{"backendTokenFile relative", func(r *Rule) { r.Args.BackendTokenFile = "engine-key" }, "serviceArguments.backendTokenFile", "not an absolute path"},
		{"backendTokenFile control character", func(r *Rule) { r.Args.BackendTokenFile = "/etc/kvgate/key\n" }, "serviceArguments.backendTokenFile", "control character"},
		{"backendTokenFile too long", func(r *Rule) { r.Args.BackendTokenFile = "/" + strings.Repeat("k", MaxBackendTokenPathLen) }, "serviceArguments.backendTokenFile", "longer than 4096"},
		{"security 3", func(r *Rule) { r.Args.Security = 3 }, "serviceArguments.security", "0 plain HTTP, 1 https"},
		{"security -1", func(r *Rule) { r.Args.Security = -1 }, "serviceArguments.security", "allowed values"},
		{"kv needs mode 4", func(r *Rule) { r.Args.Mode = 0 }, "kvExactMode", "mode 4"},
		{"kvBlockSize needs mode 4", func(r *Rule) { r.Args.Mode = 0; r.Args.KVExactMode = 0; r.Args.KVBlockSize = 16 }, "kvBlockSize", "mode 4"},
		{"pd needs mode 4", func(r *Rule) { r.Args.Mode = 2; r.Args.KVExactMode = 0; r.Args.PDDisaggMode = true }, "pd_disagg_mode", "mode 4"},
		{"ep_role needs mode 4", func(r *Rule) { r.Args.Mode = 0; r.Args.KVExactMode = 0 }, "ep_role", "mode 4"},
		{"kvBlockSize negative", func(r *Rule) { r.Args.KVBlockSize = -1 }, "kvBlockSize", "1-"},
		{"kvZmqPort 70000", func(r *Rule) { r.Args.KVZmqPort = 70000 }, "kvZmqPort", "1-65535"},
		{"kvZmqPort ranks overflow", func(r *Rule) { r.Args.KVZmqPort = 65535; r.Args.KVDpRankCount = 2 }, "kvZmqPort", "65535"},
		{"kvDpRankCount 9", func(r *Rule) { r.Args.KVDpRankCount = 9 }, "kvDpRankCount", "1-8"},
		{"kvWarmupSec negative", func(r *Rule) { r.Args.KVWarmupSec = -5 }, "kvWarmupSec", "0-"},
		{"kvReplayPort", func(r *Rule) { r.Args.KVReplayPort = 70000 }, "kvReplayPort", "1-65535"},
		{"kvHashAlgo bogus", func(r *Rule) { r.Args.KVHashAlgo = "md5" }, "kvHashAlgo", `kv-hash-algo must be one of "sha256_cbor", "xxhash_cbor", "sha256_sglang", "blockhash_trtllm"`},
		{"kvHashAlgo sglang on vllm", func(r *Rule) { r.Args.KVHashAlgo = "sha256_sglang" }, "kvHashAlgo", `kv-hash-algo "sha256_sglang" is incompatible with kv-engine-type "vllm" (omit kvHashAlgo to take the engine default "sha256_cbor")`},
		{"kvHashAlgo trtllm on vllm", func(r *Rule) { r.Args.KVHashAlgo = "blockhash_trtllm" }, "kvHashAlgo", `incompatible with kv-engine-type "vllm"`},
		{"kvHashAlgo cbor on sglang", func(r *Rule) { r.Args.KVEngineType = "sglang"; r.Args.KVHashAlgo = "sha256_cbor" }, "kvHashAlgo", `kv-hash-algo "sha256_cbor" is incompatible with kv-engine-type "sglang" (omit kvHashAlgo to take the engine default "sha256_sglang")`},
		{"kvHashAlgo trtllm on sglang", func(r *Rule) { r.Args.KVEngineType = "SGLang"; r.Args.KVHashAlgo = "blockhash_trtllm" }, "kvHashAlgo", `incompatible with kv-engine-type "sglang"`},
		{"kvHashAlgo sglang on trtllm", func(r *Rule) { r.Args.KVEngineType = "trtllm"; r.Args.KVHashAlgo = "sha256_sglang" }, "kvHashAlgo", `incompatible with kv-engine-type "trtllm" (omit kvHashAlgo to take the engine default "blockhash_trtllm")`},
		{"kvHashSeed on sglang", func(r *Rule) { r.Args.KVEngineType = "sglang"; r.Args.KVHashSeed = strp("0") }, "kvHashSeed", "without a seed"},
		{"kvHashSeed on trtllm", func(r *Rule) { r.Args.KVEngineType = "trtllm"; r.Args.KVHashSeed = strp("0") }, "kvHashSeed", "without a seed"},
		{"sglang ranks 9", func(r *Rule) { r.Args.KVEngineType = "sglang"; r.Args.KVDpRankCount = 9 }, "kvDpRankCount", "1-8"},
		{"trtllm kvExactMode 0", func(r *Rule) {
			r.Args.KVEngineType = "trtllm"
			r.Args.KVExactMode = 0
			r.Args.PDDisaggMode = true
		}, "kvExactMode", "kv-engine-type trtllm supports kvExactMode 1 or 3 (HTTP-polled event plane)"},
		{"trtllm kvZmqPort", func(r *Rule) { r.Args.KVEngineType = "trtllm"; r.Args.KVZmqPort = 6000 }, "kvZmqPort", "kvZmqPort is meaningless for kv-engine-type trtllm"},
		{"trtllm kvDpRankCount 2", func(r *Rule) { r.Args.KVEngineType = "trtllm"; r.Args.KVDpRankCount = 2 }, "kvDpRankCount", "kvDpRankCount is meaningless for kv-engine-type trtllm"},
		{"kvLoraTaskIds on vllm", func(r *Rule) {
			r.Args.KVLoraAdapters, r.Args.KVLoraTaskIDs = []string{"a"}, map[string]uint64{"a": 7}
		}, "kvLoraTaskIds", "trtllm only"},
		{"kvLoraTaskIds unknown adapter", func(r *Rule) {
			r.Args.KVEngineType = "trtllm"
			r.Args.KVLoraAdapters, r.Args.KVLoraTaskIDs = []string{"a=Qwen/Qwen3-0.6B"}, map[string]uint64{"b": 7}
		}, "kvLoraTaskIds", `"b" is not a kvLoraAdapters name`},
		{"kvLoraTaskIds needs mode 4", func(r *Rule) {
			*r = Rule{Args: ServiceArguments{ExternalIP: "10.0.0.1", Port: 80, KVLoraTaskIDs: map[string]uint64{"a": 1}}}
		}, "kvLoraTaskIds", "mode 4"},
		{"trtllm kvReplayPort", func(r *Rule) { r.Args.KVEngineType = "trtllm"; r.Args.KVReplayPort = 7000 }, "kvReplayPort", "meaningless for kv-engine-type trtllm"},
		{"xxhash without seed", func(r *Rule) { r.Args.KVHashAlgo = "xxhash_cbor" }, "kvHashAlgo", "seed"},
		{"pickle xxhash without seed", func(r *Rule) { r.Args.KVHashAlgo = "xxhash" }, "kvHashAlgo", "PYTHONHASHSEED"},
		{"engine bogus", func(r *Rule) { r.Args.KVEngineType = "tgi" }, "kvEngineType", `kv-engine-type must be one of "vllm", "sglang", "trtllm"`},
		{"llamacpp with kv", func(r *Rule) { r.Args.KVEngineType = "llamacpp" }, "kvExactMode", "llamacpp"},
		{"llamacpp with seed", func(r *Rule) {
			r.Args.KVEngineType = "llamacpp"
			r.Args.KVExactMode = 0
			r.Args.KVHashSeed = strp("0")
		}, "kvHashSeed", "llamacpp"},
		{"mode 1 no decode", func(r *Rule) { r.Endpoints[1].Role = RolePrefill }, "ep_role", "one decode"},
		{"mode 1 no prefill", func(r *Rule) { r.Endpoints[0].Role = RoleNone }, "ep_role", "prefill"},
		{"pd_disagg no roles", func(r *Rule) {
			r.Args.KVExactMode = 0
			r.Args.PDDisaggMode = true
			r.Endpoints[0].Role, r.Endpoints[1].Role = 0, 0
		}, "ep_role", "pd_disagg_mode"},
		{"mode 3 with roles", func(r *Rule) { r.Args.KVExactMode = 3; r.Args.PDDisaggMode = false }, "ep_role", "must not carry roles"},
		{"mode 3 with pd_disagg", func(r *Rule) { r.Args.KVExactMode = 3; r.Args.PDDisaggMode = true }, "pd_disagg_mode", "kvExactMode 1"},
		{"cache aware without pd", func(r *Rule) {
			r.Args.KVExactMode = 3
			r.Args.PDCacheAwareMode = true
			r.Endpoints[0].Role, r.Endpoints[1].Role = 0, 0
		}, "pd_cache_aware_mode", "pd_disagg_mode"},
		{"ttl negative", func(r *Rule) { r.Args.PDSessionTTLSec = -1 }, "pd_session_ttl_sec", "0-"},
		{"threshold 101", func(r *Rule) { r.Args.PDCacheThreshold = 101 }, "pd_cache_threshold", "0-100"},
		{"balance 256", func(r *Rule) { r.Args.PDBalanceAbsThreshold = 256 }, "pd_balance_abs_threshold", "0-255"},
		{"bootstrap port", func(r *Rule) { r.Args.PDBootstrapPort = 8998 }, "pdBootstrapPort", "sglang"},
		{"probetype ping", func(r *Rule) { r.Args.ProbeType = "ping" }, "probetype", "http, tcp, none"},
		{"probeport", func(r *Rule) { r.Args.ProbePort = 65536 }, "probeport", "0-65535"},
		{"probereq", func(r *Rule) { r.Args.ProbeReq = "health" }, "probereq", "/health"},
		{"probeTimeout", func(r *Rule) { r.Args.ProbeTimeout = -1 }, "probeTimeout", "seconds"},
		{"probeRetries", func(r *Rule) { r.Args.ProbeRetries = 1000 }, "probeRetries", "0-"},
		{"probeInterval", func(r *Rule) { r.Args.ProbeInterval = -2 }, "probeInterval", "seconds"},
		{"chwbl factor", func(r *Rule) { r.Args.CHWBLMeanLoadFactor = 50 }, "chwbl_mean_load_factor", "100-300"},
		{"endpoint ip", func(r *Rule) { r.Endpoints[0].IP = "x" }, "endpoints[0].endpointIP", "not an IP"},
		{"endpoint port", func(r *Rule) { r.Endpoints[1].TargetPort = 0 }, "endpoints[1].targetPort", "1-65535"},
		{"endpoint weight", func(r *Rule) { r.Endpoints[0].Weight = 300 }, "endpoints[0].weight", "0-255"},
		{"endpoint role 3", func(r *Rule) { r.Endpoints[0].Role = 3 }, "endpoints[0].ep_role", "0 none, 1 prefill, 2 decode"},
		{"nixl port", func(r *Rule) { r.Endpoints[0].NixlPort = -1 }, "nixl_port", "0-65535"},
		{"duplicate endpoint", func(r *Rule) { r.Endpoints[1].IP = "192.0.2.1" }, "endpoints[1].endpointIP", "twice"},
		{"lora on a non-KV rule", func(r *Rule) {
			r.Args.KVExactMode, r.Args.PDDisaggMode = 0, true
			r.Args.KVLoraAdapters = []string{"sql-lora"}
		}, "kvLoraAdapters", "KV rules only"},
		{"lora needs mode 4", func(r *Rule) {
			*r = Rule{Args: ServiceArguments{ExternalIP: "10.0.0.1", Port: 80, KVLoraAdapters: []string{"a"}}}
		}, "kvLoraAdapters", "mode 4"},
		{"trustRequestChatTemplate needs mode 4", func(r *Rule) {
			*r = Rule{Args: ServiceArguments{ExternalIP: "10.0.0.1", Port: 80, TrustRequestChatTemplate: true}}
		}, "trustRequestChatTemplate", "mode 4"},
		{"lora empty entry", func(r *Rule) { r.Args.KVLoraAdapters = []string{"a", ""} }, "kvLoraAdapters", "empty"},
		{"lora blank entry", func(r *Rule) { r.Args.KVLoraAdapters = []string{" "} }, "kvLoraAdapters", "space"},
		{"lora too long", func(r *Rule) { r.Args.KVLoraAdapters = []string{strings.Repeat("a", 257)} }, "kvLoraAdapters", "256 bytes"},
		{"lora too many", func(r *Rule) {
			for i := 0; i < 65; i++ {
				r.Args.KVLoraAdapters = append(r.Args.KVLoraAdapters, "lora"+strings.Repeat("x", i))
			}
		}, "kvLoraAdapters", "at most 64"},
		{"lora duplicate", func(r *Rule) { r.Args.KVLoraAdapters = []string{"a", "a=Qwen/Qwen3-0.6B"} }, "kvLoraAdapters", "twice"},
		{"lora no name", func(r *Rule) { r.Args.KVLoraAdapters = []string{"=Qwen/Qwen3-0.6B"} }, "kvLoraAdapters", "malformed"},
		{"lora trailing =", func(r *Rule) { r.Args.KVLoraAdapters = []string{"a="} }, "kvLoraAdapters", "malformed"},
		{"lora base is a path", func(r *Rule) { r.Args.KVLoraAdapters = []string{"a=/models/lora"} }, "kvLoraAdapters", "path"},
		{"llamacpp with lora", func(r *Rule) {
			r.Args.KVEngineType, r.Args.KVExactMode = "llamacpp", 0
			r.Args.KVLoraAdapters = []string{"a"}
		}, "kvLoraAdapters", "llamacpp"},
		{"too many endpoints", func(r *Rule) {
			r.Args.KVExactMode = 3
			r.Endpoints = nil
			for i := 0; i < MaxEndpoints+1; i++ {
				r.Endpoints = append(r.Endpoints, Endpoint{IP: "10.0.0.1", TargetPort: 1 + i})
			}
		}, "endpoints", "at most 256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := baseKVRule()
			c.edit(r)
			err := Validate(r, DefaultSettings())
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("want a ValidationError, got %v", err)
			}
			if !strings.Contains(ve.Field, c.field) || !strings.Contains(ve.Msg, c.field) {
				t.Errorf("error %q (field %q) does not name %q", ve.Msg, ve.Field, c.field)
			}
			if !strings.Contains(ve.Msg, c.words) {
				t.Errorf("error %q lacks %q", ve.Msg, c.words)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	strp := func(s string) *string { return &s }
	withSeed := DefaultSettings()
	withSeed.NoneHashSeed, withSeed.NoneHashSeedSet = "0", true
	cases := []struct {
		name string
		edit func(r *Rule)
		env  Settings
	}{
		{"spec mode 1 implied pd", func(r *Rule) {}, DefaultSettings()},
		{"explicit pd_disagg", func(r *Rule) { r.Args.PDDisaggMode = true; r.Args.PDCacheAwareMode = true }, DefaultSettings()},
		{"mode 3", func(r *Rule) {
			r.Args.KVExactMode = 3
			r.Endpoints[0].Role, r.Endpoints[1].Role = 0, 0
		}, DefaultSettings()},
		{"xxhash with rule seed", func(r *Rule) { r.Args.KVHashAlgo = "xxhash_cbor"; r.Args.KVHashSeed = strp("0") }, DefaultSettings()},
		{"xxhash with empty rule seed", func(r *Rule) { r.Args.KVHashAlgo = "xxhash"; r.Args.KVHashSeed = strp("") }, DefaultSettings()},
		{"xxhash with env seed", func(r *Rule) { r.Args.KVHashAlgo = "xxhash_cbor" }, withSeed},
		{"sha256 pickle", func(r *Rule) { r.Args.KVHashAlgo = "sha256" }, DefaultSettings()},
		{"sglang default algo", func(r *Rule) { r.Args.KVEngineType = "sglang" }, DefaultSettings()},
		{"sglang explicit algo, 8 ranks", func(r *Rule) {
			r.Args.KVEngineType, r.Args.KVHashAlgo, r.Args.KVDpRankCount = "sglang", "sha256_sglang", 8
		}, DefaultSettings()},
		{"trtllm mode 1", func(r *Rule) { r.Args.KVEngineType = "trtllm" }, DefaultSettings()},
		{"trtllm mode 3, explicit algo, default port", func(r *Rule) {
			r.Args.KVEngineType, r.Args.KVHashAlgo, r.Args.KVZmqPort, r.Args.KVDpRankCount = "trtllm", "blockhash_trtllm", 5557, 1
			r.Args.KVExactMode = 3
			r.Endpoints[0].Role, r.Endpoints[1].Role = 0, 0
		}, DefaultSettings()},
		{"trtllm lora task ids", func(r *Rule) {
			r.Args.KVEngineType = "trtllm"
			r.Args.KVLoraAdapters = []string{"a=Qwen/Qwen3-0.6B", "b"}
			r.Args.KVLoraTaskIDs = map[string]uint64{"a": 0, "b": 1<<64 - 3}
		}, DefaultSettings()},
		{"vllm data-parallel ranks", func(r *Rule) { r.Args.KVDpRankCount = 4 }, DefaultSettings()},
		{"vllm explicit", func(r *Rule) { r.Args.KVEngineType = "vllm"; r.Args.KVHashAlgo = "sha256_cbor" }, DefaultSettings()},
		{"plain rule", func(r *Rule) {
			*r = Rule{Args: ServiceArguments{ExternalIP: "10.0.0.1", Port: 80, Protocol: "TCP"}, Endpoints: []Endpoint{{IP: "10.0.0.2", TargetPort: 80, Weight: 1}}}
		}, DefaultSettings()},
		{"llamacpp pd without kv", func(r *Rule) { r.Args.KVExactMode = 0; r.Args.PDDisaggMode = true; r.Args.KVEngineType = "llamacpp" }, DefaultSettings()},
		{"lora adapters", func(r *Rule) {
			for i := 0; i < MaxLoraAdapters-1; i++ {
				r.Args.KVLoraAdapters = append(r.Args.KVLoraAdapters, "lora-"+strings.Repeat("x", i))
			}
			r.Args.KVLoraAdapters = append(r.Args.KVLoraAdapters, "sql-lora=Qwen/Qwen3-0.6B")
		}, DefaultSettings()},
		{"lora longest name", func(r *Rule) { r.Args.KVLoraAdapters = []string{strings.Repeat("a", MaxLoraAdapterLen)} }, DefaultSettings()},
		{"backendTokenFile", func(r *Rule) { r.Args.BackendTokenFile = "/etc/kvgate/engine-key" }, DefaultSettings()},
		{"backendTokenFile on a plain rule", func(r *Rule) {
			*r = Rule{Args: ServiceArguments{ExternalIP: "10.0.0.1", Port: 80, BackendTokenFile: "/run/secrets/vllm-key"}, Endpoints: []Endpoint{{IP: "10.0.0.2", TargetPort: 80, Weight: 1}}}
		}, DefaultSettings()},
		{"ipv6", func(r *Rule) { r.Args.ExternalIP = "fd00::1"; r.Endpoints[0].IP = "fd00::2" }, DefaultSettings()},
		{"256 endpoints", func(r *Rule) {
			r.Args.KVExactMode = 3
			r.Endpoints = nil
			for i := 0; i < MaxEndpoints; i++ {
				r.Endpoints = append(r.Endpoints, Endpoint{IP: "10.0.0.1", TargetPort: 1 + i})
			}
		}, DefaultSettings()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := baseKVRule()
			c.edit(r)
			if err := Validate(r, c.env); err != nil {
				t.Fatalf("rejected: %v", err)
			}
		})
	}
}

func TestCheckUpdateEngine(t *testing.T) {
	a, b := baseKVRule(), baseKVRule()
	b.Args.KVEngineType = "vllm"
	if err := CheckUpdate(a, b); err != nil {
		t.Fatalf("\"\" and vllm are the same engine: %v", err)
	}
	b.Args.KVEngineType = "llamacpp"
	var ce *ConflictError
	if err := CheckUpdate(a, b); !errors.As(err, &ce) || !strings.Contains(ce.Msg, "kvEngineType") {
		t.Fatalf("want a ConflictError naming kvEngineType, got %v", err)
	}
}

func TestParseLoraAdapter(t *testing.T) {
	cases := []struct{ in, name, tok string }{
		{"sql-lora", "sql-lora", "sql-lora"},
		{"sql-lora=Qwen/Qwen3-0.6B", "sql-lora", "Qwen/Qwen3-0.6B"},
		{"org/adapter=meta-llama/Llama-3.1-8B", "org/adapter", "meta-llama/Llama-3.1-8B"},
	}
	for _, c := range cases {
		got := ParseLoraAdapter(c.in)
		if got.Name != c.name || got.TokenizerModel != c.tok {
			t.Errorf("ParseLoraAdapter(%q) = %+v, want name %q tokenizer %q", c.in, got, c.name, c.tok)
		}
	}
}
