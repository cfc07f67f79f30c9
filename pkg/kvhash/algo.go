package kvhash

import (
	"errors"
	"fmt"
	"strings"
)

// Algo names a block-hash algorithm exactly as vLLM's
// --prefix-caching-hash-algo (and the rule field kvHashAlgo) spells it.
type Algo string

const (
	// SHA256CBOR is vLLM's "sha256_cbor": canonical CBOR of the block tuple, then SHA-256.
	SHA256CBOR Algo = "sha256_cbor"
	// XXHashCBOR is vLLM's "xxhash_cbor": canonical CBOR, then XXH3-128 (16 bytes, big-endian).
	XXHashCBOR Algo = "xxhash_cbor"
	// SHA256 is vLLM's default "sha256": pickle protocol 5 of the block tuple, then SHA-256.
	SHA256 Algo = "sha256"
	// XXHash is vLLM's "xxhash": pickle protocol 5, then XXH3-128.
	XXHash Algo = "xxhash"
	// SHA256SGLang is SGLang's chained page SHA-256, published as a signed
	// int64 (docs/engines.md).
	SHA256SGLang Algo = "sha256_sglang"
	// BlockHashTRTLLM is TensorRT-LLM's v1 BlockKeyHasher, published as a
	// uint64 (docs/engines.md).
	BlockHashTRTLLM Algo = "blockhash_trtllm"
)

// Algos lists every algorithm name ParseAlgo accepts, vLLM's first.
func Algos() []Algo {
	return []Algo{SHA256CBOR, XXHashCBOR, SHA256, XXHash, SHA256SGLang, BlockHashTRTLLM}
}

// ParseAlgo turns an algorithm name into an Algo. Names match exactly, as
// vLLM's --prefix-caching-hash-algo and the rule's kvHashAlgo do: "SHA256"
// is not "sha256". An unknown name is an
// *UnknownAlgoError; a known but unimplemented one parses fine (New then
// reports *UnsupportedError), so configuration can name it.
func ParseAlgo(s string) (Algo, error) {
	for _, a := range Algos() {
		if string(a) == s {
			return a, nil
		}
	}
	return "", &UnknownAlgoError{Name: s}
}

// known reports whether a is exactly one of the names in Algos.
func (a Algo) known() bool {
	for _, k := range Algos() {
		if a == k {
			return true
		}
	}
	return false
}

// Supported reports whether New can build a hasher for a.
func (a Algo) Supported() bool {
	switch a {
	case SHA256CBOR, XXHashCBOR, SHA256, XXHash, SHA256SGLang, BlockHashTRTLLM:
		return true
	}
	return false
}

// SignedWire reports whether the engine publishes a's 64-bit hash as a
// signed integer (SGLang) rather than an unsigned one (vLLM, TensorRT-LLM).
// Either way kvgate stores and compares the same 64-bit pattern.
func (a Algo) SignedWire() bool { return a == SHA256SGLang }

// UsesSeed reports whether a's hashes depend on a NONE_HASH seed (vLLM's
// PYTHONHASHSEED). SGLang and TensorRT-LLM chains have no seed.
func (a Algo) UsesSeed() bool { return a != SHA256SGLang && a != BlockHashTRTLLM }

// DigestLen is the length of a block digest, the value a block's child
// chains from: 32 for the SHA-256 family (SGLang's included), 16 for the
// XXH3-128 family, 8 for TensorRT-LLM (its uint64, big-endian), 0 for an
// unknown algorithm.
func (a Algo) DigestLen() int {
	switch a {
	case SHA256CBOR, SHA256, SHA256SGLang:
		return 32
	case BlockHashTRTLLM:
		return 8
	case XXHashCBOR, XXHash:
		return 16
	}
	return 0
}

// usesPickle reports whether a serializes the block tuple with pickle
// protocol 5 (vLLM's default algorithms) rather than canonical CBOR.
func (a Algo) usesPickle() bool { return a == SHA256 || a == XXHash }

// usesXXH3 reports whether a digests with XXH3-128 rather than SHA-256.
func (a Algo) usesXXH3() bool { return a == XXHash || a == XXHashCBOR }

// ErrUnsupported matches (errors.Is) every *UnsupportedError.
var ErrUnsupported = errors.New("kvhash: algorithm not supported")

// ErrUnsetSeed matches (errors.Is) every *UnsetSeedError.
var ErrUnsetSeed = errors.New("kvhash: seed unset")

// UnknownAlgoError is returned by ParseAlgo for a name that is no known algorithm.
type UnknownAlgoError struct{ Name string }

func (e *UnknownAlgoError) Error() string {
	names := make([]string, 0, 6)
	for _, a := range Algos() {
		names = append(names, string(a))
	}
	return fmt.Sprintf("kvhash: unknown hash algorithm %q (want one of %s)", e.Name, strings.Join(names, ", "))
}

// UnsupportedError is returned by New for an algorithm kvgate knows by name
// but cannot compute. Every algorithm in Algos is computable today; the type
// stays so callers keep one error path for future names.
type UnsupportedError struct{ Algo Algo }

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("kvhash: hash algorithm %q is not supported yet (supported: sha256_cbor, xxhash_cbor, sha256, xxhash, sha256_sglang, blockhash_trtllm)", string(e.Algo))
}

// Is makes errors.Is(err, ErrUnsupported) true.
func (e *UnsupportedError) Is(target error) bool { return target == ErrUnsupported }

// UnsetSeedError is returned by New for an xxhash-family contract without a
// seed: vLLM then draws NONE_HASH from os.urandom, so no external party can
// reproduce its hashes.
type UnsetSeedError struct{ Algo Algo }

func (e *UnsetSeedError) Error() string {
	return fmt.Sprintf("kvhash: %s needs an explicit seed: with PYTHONHASHSEED unset vLLM draws a random NONE_HASH for the xxhash algorithms, so its hashes cannot be reproduced; set PYTHONHASHSEED on the engines and the same string as the seed (LLB_KV_NONE_HASH_SEED)", string(e.Algo))
}

// Is makes errors.Is(err, ErrUnsetSeed) true.
func (e *UnsetSeedError) Is(target error) bool { return target == ErrUnsetSeed }

// MaxBlockSize bounds Contract.BlockSize; it keeps per-block buffers bounded.
const MaxBlockSize = 1 << 20

// BlockSizeError is returned by New for a block size outside 1..MaxBlockSize.
type BlockSizeError struct{ Size int }

func (e *BlockSizeError) Error() string {
	return fmt.Sprintf("kvhash: block size %d out of range 1..%d", e.Size, MaxBlockSize)
}
