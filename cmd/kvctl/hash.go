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
		Use:   "hash --algo A --block-size N [--seed S] [--lora-name L] [--lora-task-id T] [--cache-salt C] (--tokens 1,2,3 | --tokens-file F)",
		Short: "Compute an engine's prefix-cache block hashes for a token sequence",
		Long: `hash computes the block hashes a vLLM v1, SGLang or TensorRT-LLM engine
computes for the same tokens and prints one JSON object:

  {"algo":"sha256_cbor","block_size":16,"none_hash":"<hex>",
   "blocks":[{"index":0,"digest":"<hex>","hash":<uint64>}]}

"hash" is the 64-bit value the engine publishes in KV events, printed as the
engine prints it: unsigned for vLLM (last 8 digest bytes, big-endian) and
TensorRT-LLM, signed for SGLang (first 8 digest bytes, big-endian). "digest"
is what the next block chains from. Only full blocks are hashed, and the
tokens are hashed as given, with no trimming: TensorRT-LLM keys the blocks of
a prompt's tokens minus the last one, so pass that prefix to match what it
stores (docs/engines.md).

Algorithms: sha256_cbor, xxhash_cbor, and vLLM's default pickle-based sha256
and xxhash. The seed must equal the engines' PYTHONHASHSEED. Without --seed,
LLB_KV_NONE_HASH_SEED applies; when that is unset too the seed is unset, which
means "vllm-none-hash" for the sha256 family (current vLLM) and is an error for
the xxhash family (vLLM then draws a random NONE_HASH). LLB_KV_HASH_DEBUG=1
logs each block's serialized hash input on stderr.

sha256_sglang is SGLang's page hash: no seed; --cache-salt seeds the chain,
--lora-name namespaces every hash, and token ids up to 2^63-1 are accepted as
SGLang's native hasher accepts them. blockhash_trtllm is TensorRT-LLM's v1
BlockKeyHasher: no seed; --lora-task-id enters every block and --cache-salt
the first (through the SHA-256 salt id; TensorRT-LLM's default
tokens_per_block is 32).`,
		Example: `  kvctl hash --algo sha256_cbor --block-size 16 --seed 0 --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
  PYTHONHASHSEED=0 kvctl hash --algo xxhash --block-size 16 --seed "$PYTHONHASHSEED" --tokens-file prompt.json
  kvctl hash --algo sha256_sglang --block-size 4 --cache-salt tenant-a --tokens 1,2,3,4
  kvctl hash --algo blockhash_trtllm --block-size 32 --lora-task-id 7 --tokens-file prompt.json`,
		Args: parityNoArgs,
		RunE: runHash,
	}
	f := cmd.Flags()
	f.String("algo", string(kvhash.SHA256CBOR), "hash algorithm: sha256_cbor, xxhash_cbor, sha256, xxhash, sha256_sglang, blockhash_trtllm")
	f.Int("block-size", 16, "tokens per block (vLLM --block-size, SGLang --page-size, TensorRT-LLM tokens_per_block)")
	f.String("seed", "", "NONE_HASH seed, vLLM's PYTHONHASHSEED (default $"+hashEnvSeed+", else unset)")
	f.String("lora-name", "", "LoRA adapter name (vLLM: an extra key of every block; SGLang: the hash namespace)")
	f.Uint64("lora-task-id", 0, "TensorRT-LLM lora_task_id (blockhash_trtllm only)")
	f.String("cache-salt", "", "request cache_salt (an extra key of block 0)")
	f.String("tokens", "", "comma-separated token ids")
	f.String("tokens-file", "", "file holding a JSON array of token ids")
	root.AddCommand(cmd)
}

type hashBlockJSON struct {
	Index  int    `json:"index"`
	Digest string `json:"digest"`
	Hash   any    `json:"hash"` // uint64, or int64 for an engine that publishes signed hashes
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
	extra := kvhash.Extra{LoRAName: lora, CacheSalt: salt}
	if err := hashEngineFlags(cmd, algo, &extra); err != nil {
		return err
	}
	var seed kvhash.Seed
	seedSource := "--seed"
	// SGLang and TensorRT-LLM chains have no seed, and LLB_KV_NONE_HASH_SEED
	// is vLLM's, so only the vLLM algorithms read it.
	if f.Changed("seed") && algo.UsesSeed() {
		s, _ := f.GetString("seed")
		seed = kvhash.SeedOf(s)
	} else if s, ok := os.LookupEnv(hashEnvSeed); ok && algo.UsesSeed() {
		seed, seedSource = kvhash.SeedOf(s), hashEnvSeed
	}
	tokens, tokenFlag, err := hashTokensFromFlags(cmd)
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
	blocks, err := h.AppendBlocksWide(nil, tokens, extra)
	if err != nil {
		var re *kvhash.TokenRangeError
		if errors.As(err, &re) {
			return badInput("%s: token %d (%d) is not an integer in 0..%d for %s", tokenFlag, re.Index, re.Token, re.Max, string(algo))
		}
		return fmt.Errorf("hash: %w", err)
	}
	for _, b := range blocks {
		var v any = b.Hash
		if algo.SignedWire() {
			v = int64(b.Hash)
		}
		out.Blocks = append(out.Blocks, hashBlockJSON{Index: b.Index, Digest: hex.EncodeToString(b.Digest), Hash: v})
	}
	return parityPrintJSON(cmd.OutOrStdout(), out)
}

// hashEngineFlags checks the flags that only some algorithms take, so a
// flag that would be silently ignored is an error naming it instead.
func hashEngineFlags(cmd *cobra.Command, algo kvhash.Algo, extra *kvhash.Extra) error {
	f := cmd.Flags()
	if f.Changed("seed") && !algo.UsesSeed() {
		return badInput("--seed: %s has no seed (its chain starts from no parent); drop --seed", string(algo))
	}
	if f.Changed("lora-task-id") {
		if algo != kvhash.BlockHashTRTLLM {
			return badInput("--lora-task-id: only blockhash_trtllm hashes a LoRA task id; use --lora-name for %s", string(algo))
		}
		extra.LoRATaskID, _ = f.GetUint64("lora-task-id")
		extra.HasLoRATaskID = true
	}
	if algo == kvhash.BlockHashTRTLLM && extra.LoRAName != "" {
		return badInput("--lora-name: TensorRT-LLM hashes the adapter's task id, not its name; use --lora-task-id")
	}
	return nil
}

// hashTokensFromFlags reads exactly one of --tokens and --tokens-file and
// names the flag it read.
func hashTokensFromFlags(cmd *cobra.Command) ([]uint64, string, error) {
	f := cmd.Flags()
	list, _ := f.GetString("tokens")
	file, _ := f.GetString("tokens-file")
	hasList, hasFile := f.Changed("tokens"), f.Changed("tokens-file")
	switch {
	case hasList && hasFile:
		return nil, "", badInput("--tokens and --tokens-file are mutually exclusive")
	case !hasList && !hasFile:
		return nil, "", badInput("--tokens or --tokens-file is required")
	case hasList:
		toks, err := hashParseTokenList(list)
		return toks, "--tokens", err
	}
	raw, err := parityReadFile(file)
	if err != nil {
		return nil, "", badInput("--tokens-file: %v", err)
	}
	toks, err := hashParseTokenJSON(raw)
	return toks, "--tokens-file", err
}

// hashParseTokenList parses "1,2,3" (spaces allowed; empty means no tokens).
// Ids are read as uint64; the algorithm's own range is checked when hashing.
func hashParseTokenList(s string) ([]uint64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]uint64, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil, badInput("--tokens: token %d %q is not a non-negative integer", i, p)
		}
		out = append(out, v)
	}
	return out, nil
}

// hashParseTokenJSON parses a JSON array of token ids.
func hashParseTokenJSON(raw []byte) ([]uint64, error) {
	// Streamed token by token: a 64 MiB file of ids keeps only its []uint64,
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
	out := make([]uint64, 0, len(raw)/8)
	for i := 0; dec.More(); i++ {
		tok, err := dec.Token()
		if err != nil {
			return nil, notArray(err)
		}
		n, ok := tok.(json.Number)
		if !ok {
			return nil, badInput("--tokens-file: element %d (%v) is not a number", i, tok)
		}
		v, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil {
			return nil, badInput("--tokens-file: element %d (%s) is not a non-negative integer", i, n)
		}
		out = append(out, v)
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
