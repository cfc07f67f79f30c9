package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/kvhash"
)

// Environment variables shared with the daemon.
const (
	hashEnvSeed  = "LLB_KV_NONE_HASH_SEED" // NONE_HASH seed; must equal vLLM's PYTHONHASHSEED
	hashEnvDebug = "LLB_KV_HASH_DEBUG"     // "1": one log line per hashed block on stderr
)

// parityMaxInput bounds --tokens-file and --file reads.
const parityMaxInput = 64 << 20

func init() {
	cmd := &cobra.Command{
		Use:   "hash --algo A --block-size N [--seed S] [--lora-name L] [--cache-salt C] (--tokens 1,2,3 | --tokens-file F)",
		Short: "Compute vLLM prefix-cache block hashes for a token sequence",
		Long: `hash computes the block hashes a vLLM v1 engine computes for the same tokens
and prints one JSON object:

  {"algo":"sha256_cbor","block_size":16,"none_hash":"<hex>",
   "blocks":[{"index":0,"digest":"<hex>","hash":<uint64>}]}

"hash" is the 64-bit value vLLM publishes in KV events (last 8 digest bytes,
big-endian); "digest" is the full digest, the next block's parent. Only full
blocks are hashed.

Algorithms: sha256_cbor, xxhash_cbor, and vLLM's default pickle-based sha256
and xxhash. The seed must equal the engines' PYTHONHASHSEED. Without --seed,
LLB_KV_NONE_HASH_SEED applies; when that is unset too the seed is unset, which
means "vllm-none-hash" for the sha256 family (current vLLM) and is an error for
the xxhash family (vLLM then draws a random NONE_HASH). LLB_KV_HASH_DEBUG=1
logs each block's serialized hash input on stderr.`,
		Example: `  kvctl hash --algo sha256_cbor --block-size 16 --seed 0 --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
  PYTHONHASHSEED=0 kvctl hash --algo xxhash --block-size 16 --seed "$PYTHONHASHSEED" --tokens-file prompt.json`,
		Args: parityNoArgs,
		RunE: runHash,
	}
	f := cmd.Flags()
	f.String("algo", string(kvhash.SHA256CBOR), "hash algorithm: sha256_cbor, xxhash_cbor, sha256, xxhash")
	f.Int("block-size", 16, "tokens per block (vLLM --block-size)")
	f.String("seed", "", "NONE_HASH seed, vLLM's PYTHONHASHSEED (default $"+hashEnvSeed+", else unset)")
	f.String("lora-name", "", "LoRA adapter name (an extra key of every block)")
	f.String("cache-salt", "", "request cache_salt (an extra key of block 0)")
	f.String("tokens", "", "comma-separated token ids")
	f.String("tokens-file", "", "file holding a JSON array of token ids")
	root.AddCommand(cmd)
}

type hashBlockJSON struct {
	Index  int    `json:"index"`
	Digest string `json:"digest"`
	Hash   uint64 `json:"hash"`
}

type hashOutputJSON struct {
	Algo      string          `json:"algo"`
	BlockSize int             `json:"block_size"`
	NoneHash  string          `json:"none_hash"`
	Blocks    []hashBlockJSON `json:"blocks"`
}

func runHash(cmd *cobra.Command, _ []string) error {
	f := cmd.Flags()
	algoName, _ := f.GetString("algo")
	blockSize, _ := f.GetInt("block-size")
	lora, _ := f.GetString("lora-name")
	salt, _ := f.GetString("cache-salt")

	algo, err := kvhash.ParseAlgo(algoName)
	if err != nil {
		return badInput("--algo: %v", err)
	}
	var seed kvhash.Seed
	seedSource := "--seed"
	if f.Changed("seed") {
		s, _ := f.GetString("seed")
		seed = kvhash.SeedOf(s)
	} else if s, ok := os.LookupEnv(hashEnvSeed); ok {
		seed, seedSource = kvhash.SeedOf(s), hashEnvSeed
	}
	tokens, err := hashTokensFromFlags(cmd)
	if err != nil {
		return err
	}

	var opts []kvhash.Option
	if os.Getenv(hashEnvDebug) == "1" {
		opts = append(opts, kvhash.WithDebugLogger(slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))))
	}
	h, err := kvhash.New(kvhash.Contract{Algo: algo, BlockSize: blockSize, Seed: seed}, opts...)
	if err != nil {
		var (
			bs  *kvhash.BlockSizeError
			uns *kvhash.UnsupportedError
			us  *kvhash.UnsetSeedError
		)
		switch {
		case errors.As(err, &bs):
			return badInput("--block-size: %v", err)
		case errors.As(err, &uns):
			return badInput("--algo: %v", err)
		case errors.As(err, &us):
			return badInput("--seed: seed unset (no --seed and no %s): %v", hashEnvSeed, err)
		}
		return badInput("%s: %v", seedSource, err)
	}

	out := hashOutputJSON{
		Algo:      string(algo),
		BlockSize: blockSize,
		NoneHash:  hex.EncodeToString(h.NoneHash()),
		Blocks:    []hashBlockJSON{},
	}
	for _, b := range h.AppendBlocks(nil, tokens, kvhash.Extra{LoRAName: lora, CacheSalt: salt}) {
		out.Blocks = append(out.Blocks, hashBlockJSON{Index: b.Index, Digest: hex.EncodeToString(b.Digest), Hash: b.Hash})
	}
	return parityPrintJSON(cmd.OutOrStdout(), out)
}

// hashTokensFromFlags reads exactly one of --tokens and --tokens-file.
func hashTokensFromFlags(cmd *cobra.Command) ([]uint32, error) {
	f := cmd.Flags()
	list, _ := f.GetString("tokens")
	file, _ := f.GetString("tokens-file")
	hasList, hasFile := f.Changed("tokens"), f.Changed("tokens-file")
	switch {
	case hasList && hasFile:
		return nil, badInput("--tokens and --tokens-file are mutually exclusive")
	case !hasList && !hasFile:
		return nil, badInput("--tokens or --tokens-file is required")
	case hasList:
		return hashParseTokenList(list)
	}
	raw, err := parityReadFile(file)
	if err != nil {
		return nil, badInput("--tokens-file: %v", err)
	}
	return hashParseTokenJSON(raw)
}

// hashParseTokenList parses "1,2,3" (spaces allowed; empty means no tokens).
func hashParseTokenList(s string) ([]uint32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]uint32, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		v, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return nil, badInput("--tokens: token %d %q is not an integer in 0..4294967295", i, p)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}

// hashParseTokenJSON parses a JSON array of token ids.
func hashParseTokenJSON(raw []byte) ([]uint32, error) {
	// Streamed token by token: a 64 MiB file of ids keeps only its []uint32,
	// not one boxed value per id.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	notArray := func(err error) error {
		return badInput("--tokens-file: not a JSON array of token ids: %v", err)
	}
	tok, err := dec.Token()
	switch {
	case err != nil:
		return nil, notArray(err)
	case tok == nil:
		return nil, badInput("--tokens-file: not a JSON array of token ids (got null)")
	case tok != json.Delim('['):
		return nil, badInput("--tokens-file: not a JSON array of token ids (starts with %v)", tok)
	}
	out := make([]uint32, 0, len(raw)/8)
	for i := 0; dec.More(); i++ {
		tok, err := dec.Token()
		if err != nil {
			return nil, notArray(err)
		}
		n, ok := tok.(json.Number)
		if !ok {
			return nil, badInput("--tokens-file: element %d (%v) is not a number", i, tok)
		}
		v, err := strconv.ParseUint(n.String(), 10, 32)
		if err != nil {
			return nil, badInput("--tokens-file: element %d (%s) is not an integer in 0..4294967295", i, n)
		}
		out = append(out, uint32(v))
	}
	if _, err := dec.Token(); err != nil { // the closing ']'
		return nil, notArray(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badInput("--tokens-file: trailing data after the JSON array")
	}
	return out, nil
}

// parityNoArgs rejects positional arguments as bad input (exit 2): every
// input of hash, events decode and tokenize goes through a flag, and a stray
// word is usually a mistyped flag value.
func parityNoArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return badInput("%s: unexpected argument %q (input goes through flags; see --help)", cmd.CommandPath(), args[0])
	}
	return nil
}

// parityReadFile reads a whole file of at most parityMaxInput bytes.
func parityReadFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	raw, err := io.ReadAll(io.LimitReader(fh, parityMaxInput+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > parityMaxInput {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, parityMaxInput)
	}
	return raw, nil
}

// parityPrintJSON prints v as one compact JSON object and a newline.
func parityPrintJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
