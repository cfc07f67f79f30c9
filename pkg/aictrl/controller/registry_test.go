package controller

import (
	"os"
	"strings"
	"testing"
)

func goodRegistry(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/registry-good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseRegistryGood(t *testing.T) {
	r, err := ParseRegistry([]byte(goodRegistry(t)))
	if err != nil {
		t.Fatal(err)
	}
	if r.Service.Key != "10.10.10.254:8080:tcp" || r.EpochPeriodSec != 10 || len(r.Hosts) != 2 {
		t.Fatalf("%+v", r)
	}
	if ips := r.HostIPs(); ips[0] != "10.0.0.11" || ips[1] != "10.0.0.12" {
		t.Fatalf("order %v", ips)
	}
	if r.Addr("10.0.0.12") != "10.0.0.12:8000" {
		t.Fatal(r.Addr("10.0.0.12"))
	}
	if c := r.Hosts["10.0.0.11"].Calibration; c == nil || c.FingerprintFields["num_gpu_blocks"] != "8192" {
		t.Fatalf("calibration %+v", c)
	}
	// IPv6 keys are IP addresses too.
	v6 := strings.Replace(goodRegistry(t), "10.0.0.12:", "\"fd00::12\":", 1)
	r, err = ParseRegistry([]byte(v6))
	if err != nil {
		t.Fatal(err)
	}
	if r.Addr("fd00::12") != "[fd00::12]:8000" {
		t.Fatal(r.Addr("fd00::12"))
	}
}

func TestParseRegistryBroken(t *testing.T) {
	good := goodRegistry(t)
	cases := []struct {
		name, from, to, want string
	}{
		{"unknown top key", "epoch_period_sec: 10", "epoch_period_sec: 10\nepoch_period: 10", "field epoch_period not found"},
		{"unknown host key", "    hbm_gb: 40", "    hbm_gb: 40\n    hbm: 40", "field hbm not found"},
		{"unknown calibration key", "      measured_date:", "      measured_at: x\n      measured_date:", "field measured_at not found"},
		{"no version", "version: 1\n", "", "version: 0: want 1"},
		{"version 2", "version: 1", "version: 2", "version: 2: want 1"},
		{"empty service key", `key: "10.10.10.254:8080:tcp"`, `key: ""`, "service.key"},
		{"zero epoch", "epoch_period_sec: 10", "epoch_period_sec: 0", "epoch_period_sec"},
		{"bad fingerprint", "dd2b58d2c8f8beae", "dd2b58d2c8f8beaf", "calibration.fingerprint"},
		{"fingerprint field changed", "        num_gpu_blocks: 8192", "        num_gpu_blocks: 8193", "does not match fingerprint_fields"},
		{"duplicate ep_idx", "ep_idx: 1", "ep_idx: 0", "ep_idx: 0 is also"},
		{"missing ep_idx", "    ep_idx: 1\n", "", "ep_idx: required"},
		{"ep_idx range", "ep_idx: 1", "ep_idx: 256", "ep_idx: 256"},
		{"non-IP host key", "  10.0.0.12:", "  ep2:", "hosts.ep2: the key must be the endpoint's IP address"},
		{"host name key", "  10.0.0.12:", "  gpu-node-2.local:", "IP address"},
		{"bad role", "role: prefill\n    port: 8000\n    ep_idx: 1", "role: both\n    port: 8000\n    ep_idx: 1", "role"},
		{"port zero", "port: 8000\n    ep_idx: 1", "port: 0\n    ep_idx: 1", "port: 0"},
		{"no gpu_model", `gpu_model: "A100"`, `gpu_model: ""`, "gpu_model"},
		{"zero blocks", "expected_num_gpu_blocks: 4096", "expected_num_gpu_blocks: 0", "expected_num_gpu_blocks"},
		{"zero prior", "serving_throughput_prior: 0.5", "serving_throughput_prior: 0", "serving_throughput_prior"},
		{"zero ratio", "throughput_ratio: 1.0", "throughput_ratio: 0", "throughput_ratio"},
		{"bad state", "serving_throughput_prior: 0.5", "serving_throughput_prior: 0.5\n    state: paused", "state"},
		{"duplicate host key", "  10.0.0.12:", "  10.0.0.11:", "already defined"},
		{"two documents", "version: 1\n", "version: 1\n", ""},
		{"wrong type", "hbm_gb: 40", "hbm_gb: [40]", "decode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := strings.Replace(good, c.from, c.to, 1)
			if c.name == "two documents" {
				doc += "---\nversion: 1\n"
				c.want = "more than one"
			}
			if doc == good {
				t.Fatalf("case does not change the document")
			}
			_, err := ParseRegistry([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to contain %q", err, c.want)
			}
		})
	}
	if _, err := ParseRegistry(nil); err == nil {
		t.Fatal("empty file accepted")
	}
	if _, err := ParseRegistry([]byte(strings.Repeat("#", MaxRegistryBytes+1))); err == nil {
		t.Fatal("oversized file accepted")
	}
}

func TestFingerprint(t *testing.T) {
	// The reference rule: sorted k=v lines joined with \n, SHA-256, 16 hex.
	got := Fingerprint(map[string]string{"num_gpu_blocks": "8192", "gpu_model": "H100"})
	if got != "dd2b58d2c8f8beae" {
		t.Fatal(got)
	}
}

func FuzzParseRegistry(f *testing.F) {
	f.Add([]byte(goodRegistry(f)))
	f.Add([]byte("version: 1\nhosts: {}\n"))
	f.Add([]byte("version: 1\nservice: {key: k}\nepoch_period_sec: 1\nhosts: {\"::1\": {gpu_model: g, role: decode, port: 1, ep_idx: 0, expected_num_gpu_blocks: 1, serving_throughput_prior: 1}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRegistry(data)
		if err != nil {
			return
		}
		// Whatever is accepted must be usable without a panic.
		seen := map[int]bool{}
		for _, ip := range r.HostIPs() {
			_ = r.Addr(ip)
			h := r.Hosts[ip]
			if seen[*h.EpIdx] {
				t.Fatalf("duplicate ep_idx %d accepted", *h.EpIdx)
			}
			seen[*h.EpIdx] = true
		}
		if r.Version != 1 || r.EpochPeriodSec <= 0 {
			t.Fatalf("invalid registry accepted: %+v", r)
		}
	})
}
