// Package controller is kvgate-controller's logic: the strict registry, the
// scraper of each host's vLLM metrics, the weight law and the AiCtrl gRPC
// server (docs/controller.md).
package controller

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/pkg/epset"
)

// MaxRegistryBytes bounds the registry file; a real fleet's registry is a
// few kilobytes.
const MaxRegistryBytes = 1 << 20

// Registry is the controller's registry file (docs/controller.md, "Registry").
type Registry struct {
	Version        int             `yaml:"version"`
	Service        Service         `yaml:"service"`
	EpochPeriodSec int             `yaml:"epoch_period_sec"`
	Hosts          map[string]Host `yaml:"hosts"`
}

// Service names the load-balancer rule the advice is for.
type Service struct {
	Key  string `yaml:"key"` // "vip:port:proto"
	VIP  string `yaml:"vip"`
	Port int    `yaml:"port"`
}

// Host is one endpoint, keyed in Registry.Hosts by its IP address.
type Host struct {
	GPUModel               string       `yaml:"gpu_model"`
	HBMGB                  float64      `yaml:"hbm_gb"`
	Role                   string       `yaml:"role"`
	Port                   int          `yaml:"port"`
	EpIdx                  *int         `yaml:"ep_idx"`
	ExpectedNumGPUBlocks   int64        `yaml:"expected_num_gpu_blocks"`
	ServingThroughputPrior float64      `yaml:"serving_throughput_prior"`
	Calibration            *Calibration `yaml:"calibration"`
	// State is kvgate's extension: an operator's standing instruction for
	// the endpoint, active (default), draining or disabled. Files without
	// it are the reference's files unchanged.
	State string `yaml:"state"`
}

// Calibration is a host's measured throughput and the fingerprint of the
// configuration it was measured on.
type Calibration struct {
	ThroughputTokensPerSec float64           `yaml:"throughput_tokens_per_sec"`
	ThroughputRatio        float64           `yaml:"throughput_ratio"`
	Fingerprint            string            `yaml:"fingerprint"`
	FingerprintFields      map[string]string `yaml:"fingerprint_fields"`
	MeasuredDate           string            `yaml:"measured_date"`
	HarnessVersion         string            `yaml:"harness_version"`
}

// Fingerprint is hex(SHA-256 of the sorted "k=v" lines joined with "\n"),
// its first 16 characters.
func Fingerprint(fields map[string]string) string {
	lines := make([]string, 0, len(fields))
	for k, v := range fields {
		lines = append(lines, k+"="+v)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])[:16]
}

// LoadRegistry reads and validates the registry file at path.
func LoadRegistry(path string) (*Registry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxRegistryBytes+1))
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", path, err)
	}
	r, err := ParseRegistry(data)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", path, err)
	}
	return r, nil
}

// ParseRegistry decodes and validates a registry document. Unknown keys are
// an error, so a misspelt field is never silently ignored.
func ParseRegistry(data []byte) (*Registry, error) {
	if len(data) > MaxRegistryBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxRegistryBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var r Registry
	if err := dec.Decode(&r); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty document")
		}
		return nil, fmt.Errorf("decode: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *Registry) validate() error {
	if r.Version != 1 {
		return fmt.Errorf("version: %d: want 1 (required)", r.Version)
	}
	if strings.TrimSpace(r.Service.Key) == "" {
		return errors.New("service.key: must be non-empty")
	}
	if r.Service.Port < 0 || r.Service.Port > 65535 {
		return fmt.Errorf("service.port: %d: want 0..65535", r.Service.Port)
	}
	if r.EpochPeriodSec <= 0 || r.EpochPeriodSec > 3600 {
		return fmt.Errorf("epoch_period_sec: %d: want 1..3600", r.EpochPeriodSec)
	}
	if len(r.Hosts) == 0 {
		return errors.New("hosts: at least one host is required")
	}
	if len(r.Hosts) > epset.Max {
		return fmt.Errorf("hosts: %d hosts: at most %d", len(r.Hosts), epset.Max)
	}
	seen := map[int]string{}
	for _, ip := range r.HostIPs() {
		h := r.Hosts[ip]
		if err := validateHost(ip, &h); err != nil {
			return err
		}
		if other, dup := seen[*h.EpIdx]; dup {
			return fmt.Errorf("hosts.%s.ep_idx: %d is also hosts.%s's", ip, *h.EpIdx, other)
		}
		seen[*h.EpIdx] = ip
	}
	return nil
}

func validateHost(ip string, h *Host) error {
	at := "hosts." + ip
	a, err := netip.ParseAddr(ip)
	if err != nil || a.Zone() != "" {
		return fmt.Errorf("%s: the key must be the endpoint's IP address", at)
	}
	if strings.TrimSpace(h.GPUModel) == "" {
		return fmt.Errorf("%s.gpu_model: must be non-empty", at)
	}
	if h.HBMGB < 0 {
		return fmt.Errorf("%s.hbm_gb: %v: must not be negative", at, h.HBMGB)
	}
	if h.Role != "prefill" && h.Role != "decode" {
		return fmt.Errorf("%s.role: %q: want prefill or decode", at, h.Role)
	}
	if h.Port < 1 || h.Port > 65535 {
		return fmt.Errorf("%s.port: %d: want 1..65535", at, h.Port)
	}
	if h.EpIdx == nil {
		return fmt.Errorf("%s.ep_idx: required", at)
	}
	if *h.EpIdx < 0 || *h.EpIdx >= epset.Max {
		return fmt.Errorf("%s.ep_idx: %d: want 0..%d", at, *h.EpIdx, epset.Max-1)
	}
	if h.ExpectedNumGPUBlocks <= 0 {
		return fmt.Errorf("%s.expected_num_gpu_blocks: %d: must be > 0", at, h.ExpectedNumGPUBlocks)
	}
	if !(h.ServingThroughputPrior > 0) || h.ServingThroughputPrior > 1e9 {
		return fmt.Errorf("%s.serving_throughput_prior: %v: must be > 0", at, h.ServingThroughputPrior)
	}
	switch h.State {
	case "", "active", "draining", "disabled":
	default:
		return fmt.Errorf("%s.state: %q: want active, draining or disabled", at, h.State)
	}
	if h.Calibration != nil {
		return validateCalibration(at+".calibration", h.Calibration)
	}
	return nil
}

func validateCalibration(at string, c *Calibration) error {
	if !(c.ThroughputTokensPerSec > 0) {
		return fmt.Errorf("%s.throughput_tokens_per_sec: %v: must be > 0", at, c.ThroughputTokensPerSec)
	}
	if !(c.ThroughputRatio > 0) {
		return fmt.Errorf("%s.throughput_ratio: %v: must be > 0", at, c.ThroughputRatio)
	}
	if want := Fingerprint(c.FingerprintFields); c.Fingerprint != want {
		return fmt.Errorf("%s.fingerprint: %q does not match fingerprint_fields (want %s)", at, c.Fingerprint, want)
	}
	if v, ok := c.FingerprintFields["num_gpu_blocks"]; ok {
		if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("%s.fingerprint_fields.num_gpu_blocks: %q: not an integer", at, v)
		}
	}
	return nil
}

// HostIPs is the host keys sorted by ep_idx (then key), the snapshot order.
func (r *Registry) HostIPs() []string {
	ips := make([]string, 0, len(r.Hosts))
	for ip := range r.Hosts {
		ips = append(ips, ip)
	}
	sort.Slice(ips, func(i, j int) bool {
		a, b := r.Hosts[ips[i]].EpIdx, r.Hosts[ips[j]].EpIdx
		if a != nil && b != nil && *a != *b {
			return *a < *b
		}
		return ips[i] < ips[j]
	})
	return ips
}

// Addr is the endpoint address the controller scrapes and names as ep_addr.
func (r *Registry) Addr(ip string) string {
	return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(r.Hosts[ip].Port)).String()
}
