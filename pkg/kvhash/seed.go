package kvhash

import "strconv"

// DefaultSHA256Seed is the seed string current vLLM (PR #51875, v0.30.0)
// uses for sha256 and sha256_cbor when PYTHONHASHSEED is unset.
const DefaultSHA256Seed = "vllm-none-hash"

// Seed is the NONE_HASH seed: vLLM's PYTHONHASHSEED string, or unset.
// The zero value is unset. The empty string is a valid, set seed.
type Seed struct {
	Value string
	Set   bool
}

// SeedOf returns the set seed s (s may be empty).
func SeedOf(s string) Seed { return Seed{Value: s, Set: true} }

// String renders the seed for logs: the quoted value or "unset".
func (s Seed) String() string {
	if !s.Set {
		return "unset"
	}
	return strconv.Quote(s.Value)
}

// effective returns the seed string vLLM hashes into NONE_HASH for algo a,
// applying current vLLM's unset rule: the fixed string for the SHA-256
// family, an *UnsetSeedError for the xxhash family (vLLM goes random there).
func (s Seed) effective(a Algo) (string, error) {
	if s.Set {
		return s.Value, nil
	}
	if a.usesXXH3() {
		return "", &UnsetSeedError{Algo: a}
	}
	return DefaultSHA256Seed, nil
}
