package kvhash

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAlgo(t *testing.T) {
	tests := []struct {
		in      string
		want    Algo
		wantErr bool
	}{
		{"sha256_cbor", SHA256CBOR, false},
		{"xxhash_cbor", XXHashCBOR, false},
		{"sha256", SHA256, false},
		{"xxhash", XXHash, false},
		{" SHA256_CBOR ", "", true}, // exact names only, as vLLM parses them
		{"SHA256", "", true},
		{"sha256_sglang", SHA256SGLang, false},
		{"blockhash_trtllm", BlockHashTRTLLM, false},
		{"", "", true},
		{"md5", "", true},
		{"sha256_cbor_64bit", "", true},
	}
	for _, tt := range tests {
		got, err := ParseAlgo(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseAlgo(%q) = %q, %v; want %q, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
		var ue *UnknownAlgoError
		if tt.wantErr && !errors.As(err, &ue) {
			t.Errorf("ParseAlgo(%q) error %T, want *UnknownAlgoError", tt.in, err)
		}
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name     string
		c        Contract
		wantIs   error
		wantType string
		wantText string
	}{
		{"xxhash_cbor unset seed", Contract{Algo: XXHashCBOR, BlockSize: 16}, ErrUnsetSeed, "*kvhash.UnsetSeedError", "random"},
		{"xxhash unset seed", Contract{Algo: XXHash, BlockSize: 16}, ErrUnsetSeed, "*kvhash.UnsetSeedError", "random"},
		{"block size 0", Contract{Algo: SHA256CBOR, BlockSize: 0, Seed: SeedOf("0")}, nil, "*kvhash.BlockSizeError", "block size 0"},
		{"block size negative", Contract{Algo: SHA256CBOR, BlockSize: -16, Seed: SeedOf("0")}, nil, "*kvhash.BlockSizeError", "block size -16"},
		{"block size huge", Contract{Algo: SHA256CBOR, BlockSize: MaxBlockSize + 1, Seed: SeedOf("0")}, nil, "*kvhash.BlockSizeError", "out of range"},
		{"unknown algo", Contract{Algo: "md5", BlockSize: 16}, nil, "*kvhash.UnknownAlgoError", "md5"},
		{"algo not canonical", Contract{Algo: "SHA256_CBOR", BlockSize: 16}, nil, "*kvhash.UnknownAlgoError", "SHA256_CBOR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(tt.c)
			if err == nil || h != nil {
				t.Fatalf("New(%v) = %v, %v; want error", tt.c, h, err)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			if got := typeName(err); got != tt.wantType {
				t.Errorf("error type %s, want %s", got, tt.wantType)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not mention %q", err, tt.wantText)
			}
		})
	}
}

func typeName(err error) string {
	var (
		unsupported *UnsupportedError
		unset       *UnsetSeedError
		blockSize   *BlockSizeError
		unknown     *UnknownAlgoError
	)
	switch {
	case errors.As(err, &unsupported):
		return "*kvhash.UnsupportedError"
	case errors.As(err, &unset):
		return "*kvhash.UnsetSeedError"
	case errors.As(err, &blockSize):
		return "*kvhash.BlockSizeError"
	case errors.As(err, &unknown):
		return "*kvhash.UnknownAlgoError"
	}
	return "other"
}

// The empty string is a valid seed (vLLM hashes it like any other string),
// distinct from both unset and "0".
func TestEmptySeedIsASeed(t *testing.T) {
	for _, a := range []Algo{SHA256CBOR, XXHashCBOR, SHA256, XXHash} {
		empty, err := New(Contract{Algo: a, BlockSize: 16, Seed: SeedOf("")})
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		zero, err := New(Contract{Algo: a, BlockSize: 16, Seed: SeedOf("0")})
		if err != nil {
			t.Fatal(err)
		}
		if string(empty.NoneHash()) == string(zero.NoneHash()) {
			t.Errorf("%s: empty seed and seed 0 give the same NONE_HASH", a)
		}
		if len(empty.NoneHash()) != a.DigestLen() {
			t.Errorf("%s: NONE_HASH length %d, want %d", a, len(empty.NoneHash()), a.DigestLen())
		}
	}
}
